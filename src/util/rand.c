/*
 * util/rand.c: random tokens for ids and lease owners. Uses OpenSSL's
 * RAND_bytes, which is thread-safe; never a non-cryptographic generator for
 * anything a client could see or guess.
 */
#include "util/rand.h"

#include <openssl/rand.h>

#include "util/error.h"

void idem__hex(char *out, const unsigned char *in, size_t n)
{
	static const char digits[] = "0123456789abcdef";

	for (size_t i = 0; i < n; i++) {
		out[2 * i] = digits[in[i] >> 4];
		out[2 * i + 1] = digits[in[i] & 15];
	}
	out[2 * n] = '\0';
}

int idem__rand_hex(char *out, size_t nbytes)
{
	unsigned char buf[64];

	if (nbytes > sizeof(buf))
		return idem__error(IDEM_EINVAL, "random token too long");
	if (RAND_bytes(buf, (int)nbytes) != 1)
		return idem__error(IDEM_ESTORE, "RAND_bytes failed");
	idem__hex(out, buf, nbytes);
	return 0;
}

unsigned idem__rand_below(unsigned bound)
{
	unsigned v = 0;

	if (bound == 0)
		return 0;
	if (RAND_bytes((unsigned char *)&v, sizeof(v)) != 1)
		return bound / 2;
	return v % bound;
}
