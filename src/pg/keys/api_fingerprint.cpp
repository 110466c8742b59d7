// idem_fingerprint (SHA-256 of jsonb in canonical form, of text as UTF-8, of bytes)
// and idem_derive (the key of a downstream step).
#include <cstring>
#include <string>

#include "core/canonical_json.hpp"
#include "core/sha256.hpp"
#include "pg/common/errors.hpp"
#include "pg/common/key_type.hpp"

extern "C" {
#include "mb/pg_wchar.h"
#include "utils/jsonb.h"
}

namespace idempotency {

static void require_argument(FunctionCallInfo fcinfo, int n, const char* name) {
  if (PG_ARGISNULL(n))
    ereport(ERROR, errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED), errmsg("%s must not be null", name));
}

static bytea* digest_to_bytea(const Digest& digest) {
  bytea* result = static_cast<bytea*>(palloc(VARHDRSZ + digest.size()));
  SET_VARSIZE(result, VARHDRSZ + digest.size());
  memcpy(VARDATA(result), digest.data(), digest.size());
  return result;
}

// Server-encoded text as UTF-8 (the same pointer when the database is UTF-8).
static std::string_view as_utf8(const char* data, size_t length) {
  const char* utf8 = pg_server_to_any(data, static_cast<int>(length), PG_UTF8);
  return {utf8, utf8 == data ? length : strlen(utf8)};
}

static Datum fingerprint_bytes(std::string_view bytes) {
  Digest digest = sha256(bytes);
  PG_RETURN_BYTEA_P(digest_to_bytea(digest));
}

static Datum fingerprint_jsonb(FunctionCallInfo fcinfo) {
  require_argument(fcinfo, 0, "the value to fingerprint");
  Jsonb* value = PG_GETARG_JSONB_P(0);
  char* text = JsonbToCString(nullptr, &value->root, VARSIZE(value));
  Digest digest;
  {
    std::string canonical = canonical_json(as_utf8(text, strlen(text)));
    digest = sha256(canonical);
  }
  PG_RETURN_BYTEA_P(digest_to_bytea(digest));
}

static Datum fingerprint_text(FunctionCallInfo fcinfo) {
  require_argument(fcinfo, 0, "the value to fingerprint");
  text* value = PG_GETARG_TEXT_PP(0);
  return fingerprint_bytes(as_utf8(VARDATA_ANY(value), VARSIZE_ANY_EXHDR(value)));
}

static Datum fingerprint_bytea(FunctionCallInfo fcinfo) {
  require_argument(fcinfo, 0, "the value to fingerprint");
  bytea* value = PG_GETARG_BYTEA_PP(0);
  return fingerprint_bytes({VARDATA_ANY(value), VARSIZE_ANY_EXHDR(value)});
}

static Datum derive(FunctionCallInfo fcinfo) {
  require_argument(fcinfo, 0, "root");
  require_argument(fcinfo, 1, "step");
  const char* root = key_cstring(PG_GETARG_VARLENA_PP(0));
  text* step = PG_GETARG_TEXT_PP(1);
  char derived[33];
  {
    std::string key = derive_key(root, as_utf8(VARDATA_ANY(step), VARSIZE_ANY_EXHDR(step)));
    strlcpy(derived, key.c_str(), sizeof(derived));
  }
  PG_RETURN_POINTER(make_key(derived, strlen(derived)));
}

}  // namespace idempotency

using namespace idempotency;

IDEM_SQL_FUNCTION(idem_fingerprint_jsonb, fingerprint_jsonb)
IDEM_SQL_FUNCTION(idem_fingerprint_text, fingerprint_text)
IDEM_SQL_FUNCTION(idem_fingerprint_bytea, fingerprint_bytea)
IDEM_SQL_FUNCTION(idem_derive, derive)
