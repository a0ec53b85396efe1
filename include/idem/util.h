/*
 * idem/util.h: validation of keys and the request fingerprint. Pure
 * functions: no store, no allocation visible to the caller. The validators
 * answer NULL as one more invalid input (IDEM_EINVAL, no detail kept); the
 * fingerprint calls answer a NULL argument IDEM_EINVAL naming it.
 */
#ifndef IDEM_UTIL_H
#define IDEM_UTIL_H

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 0 when key is 1..255 bytes, each 0x21..0x7E; IDEM_EINVAL otherwise. */
IDEM_EXTERN int idem_key_validate(const char *key, size_t len);

/* 0 when s is 1..64 characters of A-Z a-z 0-9 _ - . ; IDEM_EINVAL otherwise. */
IDEM_EXTERN int idem_natural_key_validate(const char *s, size_t len);

/* 0 when s is 1..max bytes of 0x21..0x7E (scopes); IDEM_EINVAL otherwise. */
IDEM_EXTERN int idem_token_validate(const char *s, size_t len, size_t max);

/*
 * The request fingerprint: lower-case hex SHA-256 over the method, the path
 * and the canonical JSON of body (object keys sorted, compact, non-ASCII
 * escaped), so field order and white space never make a request differ.
 * out:  65 bytes, receives 64 hex digits and a NUL ("" after an error).
 * method, path: required.
 * body: JSON text of len bytes; len 0 means "no body" (body may be NULL).
 * Returns 0; IDEM_EINVAL when body is not valid JSON or repeats an object key
 * (detail in idem_error_last()); IDEM_ENOMEM.
 */
IDEM_EXTERN int idem_fingerprint(char out[65], const char *method, const char *path,
                                 const char *body, size_t len);

/*
 * The same fingerprint from a body already in canonical form (what
 * idem_fingerprint hashes after re-serialising), for callers that parsed
 * the body anyway: json_dumps(doc, JSON_COMPACT | JSON_SORT_KEYS |
 * JSON_ENSURE_ASCII | JSON_ENCODE_ANY). canon NULL / len 0: no body.
 */
IDEM_EXTERN int idem_fingerprint_canonical(char out[65], const char *method, const char *path,
                                           const char *canon, size_t len);

#ifdef __cplusplus
}
#endif
#endif
