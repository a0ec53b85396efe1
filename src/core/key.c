/*
 * core/key.c: validation of idempotency keys, natural keys and scopes.
 * Keys are compared byte for byte and never trimmed or case-folded, so
 * validation only rejects; it never rewrites.
 */
#include "idem/util.h"

int idem_token_validate(const char *s, size_t len, size_t max)
{
	if (!s || len == 0 || len > max)
		return IDEM_EINVAL;
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];

		if (c < 0x21 || c > 0x7E)
			return IDEM_EINVAL;
	}
	return 0;
}

int idem_key_validate(const char *key, size_t len)
{
	return idem_token_validate(key, len, 255);
}

int idem_natural_key_validate(const char *s, size_t len)
{
	if (!s || len == 0 || len > 64)
		return IDEM_EINVAL;
	for (size_t i = 0; i < len; i++) {
		char c = s[i];

		if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
		      c == '_' || c == '-' || c == '.'))
			return IDEM_EINVAL;
	}
	return 0;
}
