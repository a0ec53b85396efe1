/*
 * core/fingerprint.c: the request fingerprint. The body is parsed with
 * jansson and re-serialised canonically (sorted keys, compact, non-ASCII as
 * \u escapes) so that two encodings of the same JSON value hash alike. The
 * three parts are length-prefixed before hashing so that no choice of method,
 * path and body can collide with another by shifting bytes between them.
 */
#include <jansson.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "idem/util.h"
#include "util/error.h"
#include "util/rand.h"

static int hash_part(EVP_MD_CTX *md, const void *p, size_t len)
{
	unsigned char n[8];

	for (int i = 0; i < 8; i++)
		n[i] = (unsigned char)((uint64_t)len >> (56 - 8 * i));
	return EVP_DigestUpdate(md, n, sizeof(n)) == 1 && EVP_DigestUpdate(md, p, len) == 1;
}

/*
 * SHA-256, fetched from the provider once: EVP_sha256() with a NULL engine
 * looks the implementation up again on every EVP_DigestInit_ex (EVP_MD_fetch
 * was a tenth of the hashing cost in callgrind, docs/benchmarks.md). NULL
 * when the fetch failed; then the implicit lookup is used.
 */
static EVP_MD *sha256_md;
/* Each thread's digest context, reused (freed when the thread ends). */
static pthread_key_t ctx_key;
static int ctx_key_ok;

static void free_ctx(void *md)
{
	EVP_MD_CTX_free(md);
}

static void fetch_sha256(void)
{
	sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL);
	ctx_key_ok = pthread_key_create(&ctx_key, free_ctx) == 0;
}

static const EVP_MD *sha256(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	pthread_once(&once, fetch_sha256);
	return sha256_md ? sha256_md : EVP_sha256();
}

/* The calling thread's context (kept) or a new one (*owned: free it after). */
static EVP_MD_CTX *ctx_get(int *owned)
{
	EVP_MD_CTX *md = ctx_key_ok ? pthread_getspecific(ctx_key) : NULL;

	*owned = 0;
	if (md)
		return md;
	if (!(md = EVP_MD_CTX_new()))
		return NULL;
	if (ctx_key_ok && pthread_setspecific(ctx_key, md) == 0)
		return md;
	*owned = 1;
	return md;
}

int idem_fingerprint_canonical(char out[65], const char *method, const char *path,
			       const char *canon, size_t len)
{
	const EVP_MD *sha = sha256(); /* first: it creates the context key */
	EVP_MD_CTX *md = NULL;
	unsigned char digest[32];
	unsigned int dlen = 0;
	int rc = 0, owned = 0;

	out[0] = '\0';
	if (!method || !path || (len && !canon))
		return idem__error(IDEM_EINVAL, "fingerprint: method and path are required");
	if (!(md = ctx_get(&owned)) || EVP_DigestInit_ex(md, sha, NULL) != 1 ||
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

	out[0] = '\0';
	if (!method || !path || (len && !body))
		return idem__error(IDEM_EINVAL, "fingerprint: method and path are required");
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
