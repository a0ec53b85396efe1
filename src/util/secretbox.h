/*
 * util/secretbox.h: sealing short secrets for storage (channel signing
 * secrets at rest) with AES-256-GCM from OpenSSL EVP, and reading the key.
 *
 * A sealed value is text: "v1:" + base64(nonce[12] | ciphertext | tag[16]),
 * with a fresh random nonce per seal and the caller's associated data (the
 * channel name) authenticated with it, so a sealed secret copied to another
 * row does not open. The version prefix leaves room for another format;
 * text without it is a plaintext value from before encryption.
 */
#ifndef IDEM_UTIL_SECRETBOX_H
#define IDEM_UTIL_SECRETBOX_H

#include <stddef.h>

#define IDEM_SECRETBOX_KEY    32
#define IDEM_SECRETBOX_PREFIX "v1:"

/* Room needed to seal n plaintext bytes, including the NUL. */
#define IDEM_SECRETBOX_SEALED_SIZE(n) (3 + 4 * ((12 + (n) + 16 + 2) / 3) + 1)

/* Whether stored text is a sealed value (else: plaintext). */
int idem__secretbox_is_sealed(const char *text);

/*
 * Seal plain (n bytes) under key with aad; out (size outsize) receives the
 * NUL-terminated sealed text. Returns 0, IDEM_EINVAL when out is too small,
 * IDEM_ESTORE when the cipher fails.
 */
int idem__secretbox_seal(const unsigned char key[IDEM_SECRETBOX_KEY], const char *aad,
                         const void *plain, size_t n, char *out, size_t outsize);

/*
 * Open sealed text; out (size outsize) receives the plaintext, NUL-terminated,
 * and *n its length. IDEM_EINVAL when the text is malformed or does not open
 * under key and aad (a wrong key, or a value moved to another row).
 */
int idem__secretbox_open(const unsigned char key[IDEM_SECRETBOX_KEY], const char *aad,
                         const char *sealed, char *out, size_t outsize, size_t *n);

/*
 * Read a key file: exactly 32 bytes, or 64 hex digits with an optional
 * trailing newline (`openssl rand -hex 32`). Refuses a file that its group
 * or others may read or write, and anything but a regular file. IDEM_EINVAL
 * with a message naming the path on any of these.
 */
int idem__secretbox_read_key(const char *path, unsigned char key[IDEM_SECRETBOX_KEY]);

#endif
