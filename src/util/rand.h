/* util/rand.h: unguessable random tokens from OpenSSL's CSPRNG. */
#ifndef IDEM_UTIL_RAND_H
#define IDEM_UTIL_RAND_H

#include <stddef.h>

/* Fill out with 2*nbytes lower-case hex digits and a NUL (out: 2*nbytes+1). 0 or IDEM_ESTORE. */
int idem__rand_hex(char *out, size_t nbytes);

/* A uniformly random value in [0, bound) for jitter; never fails. */
unsigned idem__rand_below(unsigned bound);

/* Lower-case hex of n bytes into out (2n+1 bytes). */
void idem__hex(char *out, const unsigned char *in, size_t n);

#endif
