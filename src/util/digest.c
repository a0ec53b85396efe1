/* util/digest.c: SHA-256 fetched once, one context per thread (digest.h). */
#include "util/digest.h"

#include <pthread.h>

#include "idem/util.h"
#include "util/error.h"

static EVP_MD *sha256_md; /* NULL when the fetch failed */
static pthread_key_t ctx_key;
static int ctx_key_ok;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void free_ctx(void *md)
{
	EVP_MD_CTX_free(md);
}

static void setup(void)
{
	sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL);
	ctx_key_ok = pthread_key_create(&ctx_key, free_ctx) == 0;
}

const EVP_MD *idem__sha256_md(void)
{
	pthread_once(&once, setup);
	return sha256_md ? sha256_md : EVP_sha256();
}

EVP_MD_CTX *idem__sha256_ctx(int *owned)
{
	EVP_MD_CTX *md;

	pthread_once(&once, setup);
	*owned = 0;
	if (ctx_key_ok && (md = pthread_getspecific(ctx_key)))
		return md;
	if (!(md = EVP_MD_CTX_new()))
		return NULL;
	if (ctx_key_ok && pthread_setspecific(ctx_key, md) == 0)
		return md;
	*owned = 1;
	return md;
}

int idem__sha256(unsigned char out[32], const void *data, size_t len)
{
	const EVP_MD *sha = idem__sha256_md();
	int owned = 0, ok;
	unsigned int n = 0;
	EVP_MD_CTX *md = idem__sha256_ctx(&owned);

	ok = md && EVP_DigestInit_ex(md, sha, NULL) == 1 && EVP_DigestUpdate(md, data, len) == 1 &&
	     EVP_DigestFinal_ex(md, out, &n) == 1 && n == 32;
	if (owned)
		EVP_MD_CTX_free(md);
	return ok ? 0 : idem__error(IDEM_ENOMEM, "SHA-256 failed");
}
