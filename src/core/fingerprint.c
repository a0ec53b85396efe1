/*
 * core/fingerprint.c: the request fingerprint. The body is parsed with
 * jansson and re-serialised canonically (sorted keys, compact, non-ASCII as
 * \u escapes) so that two encodings of the same JSON value hash alike. The
 * three parts are length-prefixed before hashing so that no choice of method,
 * path and body can collide with another by shifting bytes between them.
 */
#include <jansson.h>
#include <openssl/evp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "idem/util.h"
#include "util/digest.h"
#include "util/error.h"
#include "util/rand.h"

static int hash_part(EVP_MD_CTX *md, const void *p, size_t len)
{
	unsigned char n[8];

	for (int i = 0; i < 8; i++)
		n[i] = (unsigned char)((uint64_t)len >> (56 - 8 * i));
	return EVP_DigestUpdate(md, n, sizeof(n)) == 1 && EVP_DigestUpdate(md, p, len) == 1;
}

int idem_fingerprint_canonical(char out[65], const char *method, const char *path,
                               const char *canon, size_t len)
{
	const EVP_MD *sha = idem__sha256_md();
	EVP_MD_CTX *md = NULL;
	unsigned char digest[32];
	unsigned int dlen = 0;
	int rc = 0, owned = 0;

	IDEM__ASSERT_ARG(out);
	out[0] = '\0';
	IDEM__ASSERT_ARG(method);
	IDEM__ASSERT_ARG(path);
	IDEM__ASSERT_ARG(canon || len == 0);
	if (!(md = idem__sha256_ctx(&owned)) || EVP_DigestInit_ex(md, sha, NULL) != 1 ||
	    !hash_part(md, method, strlen(method)) || !hash_part(md, path, strlen(path)) ||
	    !hash_part(md, len ? canon : "", len) || EVP_DigestFinal_ex(md, digest, &dlen) != 1 ||
	    dlen != sizeof(digest))
		rc = idem__error(IDEM_ENOMEM, "fingerprint: SHA-256 failed");
	else
		idem__hex(out, digest, sizeof(digest));
	if (owned)
		EVP_MD_CTX_free(md);
	return rc;
}

int idem_fingerprint(char out[65], const char *method, const char *path, const char *body,
                     size_t len)
{
	json_t *doc = NULL;
	char *canon = NULL;
	json_error_t jerr;
	int rc = 0;

	IDEM__ASSERT_ARG(out);
	out[0] = '\0';
	IDEM__ASSERT_ARG(method);
	IDEM__ASSERT_ARG(path);
	IDEM__ASSERT_ARG(body || len == 0);
	if (len) {
		doc = json_loadb(body, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
		if (!doc) {
			rc = idem__error(IDEM_EINVAL, "malformed JSON at line %d column %d: %s",
			                 jerr.line, jerr.column, jerr.text);
			goto done;
		}
		canon = json_dumps(doc, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENSURE_ASCII |
		                            JSON_ENCODE_ANY);
		if (!canon) {
			rc = idem__error(IDEM_ENOMEM, "fingerprint: cannot serialise body");
			goto done;
		}
	}
	rc = idem_fingerprint_canonical(out, method, path, canon, canon ? strlen(canon) : 0);
done:
	free(canon);
	json_decref(doc);
	return rc;
}
