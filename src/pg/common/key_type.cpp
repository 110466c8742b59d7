// idem_key input/output, comparison, hashing and casts.
#include "pg/common/key_type.hpp"

#include <cstring>
#include <string>

#include "core/key.hpp"
#include "pg/common/errors.hpp"

extern "C" {
#include "common/hashfn.h"
#include "lib/stringinfo.h"
#include "libpq/pqformat.h"
#include "utils/builtins.h"
#include "utils/uuid.h"
}

namespace idempotency {

void ensure_valid_key(const char* data, size_t length) {
  KeyProblem problem = check_key(std::string_view(data, length));
  if (!problem) return;
  char message[256];
  {
    std::string text = describe(problem);
    strlcpy(message, text.c_str(), sizeof(message));
  }
  ereport(ERROR, errcode(ERRCODE_INVALID_TEXT_REPRESENTATION), errmsg("%s", message));
}

static struct varlena* new_key(const char* stored, size_t length) {
  auto key = static_cast<struct varlena*>(palloc(VARHDRSZ + length));
  SET_VARSIZE(key, VARHDRSZ + length);
  memcpy(VARDATA(key), stored, length);
  return key;
}

struct varlena* make_key(const char* data, size_t length) {
  ensure_valid_key(data, length);
  char stored[kMaxKeyBytes];
  return new_key(stored, store_key(std::string_view(data, length), stored));
}

static std::string_view stored_form(const struct varlena* key) {
  return std::string_view(VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key));
}

char* key_cstring(const struct varlena* key) {
  char* characters = static_cast<char*>(palloc(kMaxKeyBytes + 1));
  characters[load_key(stored_form(key), characters)] = '\0';
  return characters;
}

text* key_text(const struct varlena* key) {
  char characters[kMaxKeyBytes];
  return cstring_to_text_with_len(characters,
                                  static_cast<int>(load_key(stored_form(key), characters)));
}

static int compare_keys(FunctionCallInfo fcinfo) {
  return compare_stored_keys(stored_form(PG_GETARG_VARLENA_PP(0)),
                             stored_form(PG_GETARG_VARLENA_PP(1)));
}

static Datum key_in(FunctionCallInfo fcinfo) {
  const char* input = PG_GETARG_CSTRING(0);
  return PointerGetDatum(make_key(input, strlen(input)));
}

static Datum key_out(FunctionCallInfo fcinfo) {
  return CStringGetDatum(key_cstring(PG_GETARG_VARLENA_PP(0)));
}

// The wire format is the key's characters; keys are ASCII, so no encoding conversion.
static Datum key_recv(FunctionCallInfo fcinfo) {
  StringInfo buf = reinterpret_cast<StringInfo>(PG_GETARG_POINTER(0));
  int length = buf->len - buf->cursor;
  const char* bytes = pq_getmsgbytes(buf, length);
  return PointerGetDatum(make_key(bytes, static_cast<size_t>(length)));
}

static Datum key_send(FunctionCallInfo fcinfo) {
  char characters[kMaxKeyBytes];
  size_t length = load_key(stored_form(PG_GETARG_VARLENA_PP(0)), characters);
  StringInfoData buf;
  pq_begintypsend(&buf);
  pq_sendbytes(&buf, characters, static_cast<int>(length));
  PG_RETURN_BYTEA_P(pq_endtypsend(&buf));
}

// Each key has one stored form, so hashing it hashes the key.
static Datum key_hash(FunctionCallInfo fcinfo) {
  struct varlena* key = PG_GETARG_VARLENA_PP(0);
  return hash_any(reinterpret_cast<const unsigned char*>(VARDATA_ANY(key)),
                  static_cast<int>(VARSIZE_ANY_EXHDR(key)));
}

static Datum key_hash_extended(FunctionCallInfo fcinfo) {
  struct varlena* key = PG_GETARG_VARLENA_PP(0);
  return hash_any_extended(reinterpret_cast<const unsigned char*>(VARDATA_ANY(key)),
                           static_cast<int>(VARSIZE_ANY_EXHDR(key)), PG_GETARG_INT64(1));
}

static Datum key_from_text(FunctionCallInfo fcinfo) {
  struct varlena* input = PG_GETARG_VARLENA_PP(0);
  PG_RETURN_POINTER(make_key(VARDATA_ANY(input), VARSIZE_ANY_EXHDR(input)));
}

static Datum key_to_text(FunctionCallInfo fcinfo) {
  PG_RETURN_TEXT_P(key_text(PG_GETARG_VARLENA_PP(0)));
}

// The key whose characters uuid_out writes (lowercase, hyphenated).
static Datum key_from_uuid(FunctionCallInfo fcinfo) {
  char stored[kStoredUuidBytes];
  store_uuid(PG_GETARG_UUID_P(0)->data, stored);
  return PointerGetDatum(new_key(stored, sizeof(stored)));
}

struct varlena* random_uuid_key() {
  unsigned char uuid[kUuidBytes];
  if (!pg_strong_random(uuid, sizeof(uuid)))
    ereport(ERROR, errcode(ERRCODE_INTERNAL_ERROR), errmsg("could not generate random values"));
  uuid[6] = (uuid[6] & 0x0f) | 0x40;  // version 4 (RFC 9562)
  uuid[8] = (uuid[8] & 0x3f) | 0x80;  // variant 10
  char stored[kStoredUuidBytes];
  store_uuid(uuid, stored);
  return new_key(stored, sizeof(stored));
}

}  // namespace idempotency

using namespace idempotency;

IDEM_SQL_FUNCTION(idem_key_in, key_in)
IDEM_SQL_FUNCTION(idem_key_out, key_out)
IDEM_SQL_FUNCTION(idem_key_recv, key_recv)
IDEM_SQL_FUNCTION(idem_key_send, key_send)
IDEM_SQL_FUNCTION(idem_key_hash, key_hash)
IDEM_SQL_FUNCTION(idem_key_hash_extended, key_hash_extended)
IDEM_SQL_FUNCTION(idem_key_from_text, key_from_text)
IDEM_SQL_FUNCTION(idem_key_to_text, key_to_text)
IDEM_SQL_FUNCTION(idem_key_from_uuid, key_from_uuid)

// Comparisons are on every index probe: plain functions, nothing to guard.
extern "C" {
PG_FUNCTION_INFO_V1(idem_key_cmp);
PG_FUNCTION_INFO_V1(idem_key_eq);
PG_FUNCTION_INFO_V1(idem_key_ne);
PG_FUNCTION_INFO_V1(idem_key_lt);
PG_FUNCTION_INFO_V1(idem_key_le);
PG_FUNCTION_INFO_V1(idem_key_gt);
PG_FUNCTION_INFO_V1(idem_key_ge);
Datum idem_key_cmp(PG_FUNCTION_ARGS) { PG_RETURN_INT32(compare_keys(fcinfo)); }
Datum idem_key_eq(PG_FUNCTION_ARGS) { PG_RETURN_BOOL(compare_keys(fcinfo) == 0); }
Datum idem_key_ne(PG_FUNCTION_ARGS) { PG_RETURN_BOOL(compare_keys(fcinfo) != 0); }
Datum idem_key_lt(PG_FUNCTION_ARGS) { PG_RETURN_BOOL(compare_keys(fcinfo) < 0); }
Datum idem_key_le(PG_FUNCTION_ARGS) { PG_RETURN_BOOL(compare_keys(fcinfo) <= 0); }
Datum idem_key_gt(PG_FUNCTION_ARGS) { PG_RETURN_BOOL(compare_keys(fcinfo) > 0); }
Datum idem_key_ge(PG_FUNCTION_ARGS) { PG_RETURN_BOOL(compare_keys(fcinfo) >= 0); }
}
