// FunctionRef: a callable passed down without allocating.
#pragma once

namespace idempotency {

// A reference to a callable, kept on the stack across calls that can ereport (so
// trivially destructible, unlike std::function).
template <typename Fn>
class FunctionRef;
template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  template <typename F>
  FunctionRef(F& f)  // NOLINT(google-explicit-constructor): passed as a lambda
      : object_(&f), call_([](void* o, Args... a) -> R { return (*static_cast<F*>(o))(a...); }) {}
  R operator()(Args... a) const { return call_(object_, a...); }

 private:
  void* object_;
  R (*call_)(void*, Args...);
};

}  // namespace idempotency
