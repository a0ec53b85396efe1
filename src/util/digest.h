/*
 * util/digest.h: SHA-256 with the implementation fetched from the provider
 * once and a digest context kept per thread. EVP_sha256() with a NULL
 * engine looks the implementation up again on every EVP_DigestInit_ex
 * (EVP_MD_fetch was a quarter of an API key's hashing in callgrind,
 * docs/benchmarks.md), and EVP_Digest allocates a context per call.
 */
#ifndef IDEM_UTIL_DIGEST_H
#define IDEM_UTIL_DIGEST_H

#include <openssl/evp.h>
#include <stddef.h>

/* The fetched SHA-256 (EVP_sha256() when the fetch failed). */
const EVP_MD *idem__sha256_md(void);

/* The calling thread's context, reused (it is freed when the thread ends),
 * or a new one when it cannot be kept (*owned = 1: EVP_MD_CTX_free it
 * after). NULL when out of memory. */
EVP_MD_CTX *idem__sha256_ctx(int *owned);

/* out = SHA-256(data[0..len)). 0, or IDEM_ENOMEM (set as the thread's error). */
int idem__sha256(unsigned char out[32], const void *data, size_t len);

#endif
