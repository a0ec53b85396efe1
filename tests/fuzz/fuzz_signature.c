/*
 * tests/fuzz/fuzz_signature.c: the X-Signature check of channel callbacks
 * (idem_pay_verify_signature). The input is "signature\nbody"; "@SIG@" as
 * the signature stands for the right one. Accepted exactly when the
 * signature is the lower- or upper-case hex HMAC-SHA256 of the body with
 * the channel's secret, by an independent computation.
 */
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "fuzz_env.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_env *e = fuzz_env_get();
	const uint8_t *nl = memchr(data, '\n', size);
	size_t sig_len = nl ? (size_t)(nl - data) : size;
	const uint8_t *body = nl ? nl + 1 : data + size;
	size_t body_len = size - sig_len - (nl ? 1 : 0);
	unsigned char mac[EVP_MAX_MD_SIZE];
	unsigned int mac_len = 0;
	char hex[2 * EVP_MAX_MD_SIZE + 1];
	char *sig;
	int rc, want;

	if (!HMAC(EVP_sha256(), e->secret, (int)strlen(e->secret), body, body_len, mac, &mac_len))
		fuzz_fail("HMAC failed");
	for (unsigned int i = 0; i < mac_len; i++) {
		hex[2 * i] = "0123456789abcdef"[mac[i] >> 4];
		hex[2 * i + 1] = "0123456789abcdef"[mac[i] & 15];
	}
	hex[2 * mac_len] = '\0';
	if (sig_len == 5 && memcmp(data, "@SIG@", 5) == 0) {
		sig = fuzz_strndup((const uint8_t *)hex, strlen(hex));
		sig_len = strlen(hex);
	} else {
		sig = fuzz_strndup(data, sig_len);
	}
	rc = idem_pay_verify_signature(e->pay, e->channel, sig, sig_len, body, body_len);
	want = sig_len == 2 * mac_len && strncasecmp(sig, hex, sig_len) == 0 &&
	       memchr(sig, '\0', sig_len) == NULL;
	if (rc < 0 && rc != IDEM_ENOTFOUND)
		fuzz_fail(idem_error_last()->message);
	if ((rc == 0) != want)
		fuzz_fail(rc == 0 ? "wrong signature accepted" : "right signature rejected");
	/* An unknown channel never verifies. */
	if (idem_pay_verify_signature(e->pay, "no-such-channel", sig, sig_len, body, body_len) !=
	    IDEM_ENOTFOUND)
		fuzz_fail("signature of an unknown channel not refused");
	free(sig);
	return 0;
}
