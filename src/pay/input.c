/*
 * pay/input.c: strict request parsing. Unknown members are rejected so a
 * typo never passes silently; types are checked exactly (an amount is a JSON
 * integer, never a string or a float); numbers that do not fit are a
 * validation error, not a crash. Also ids and timestamps.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pay/internal.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/rand.h"

static const char *type_name(pay__ftype t)
{
	return t == F_STRING ? "a string" : t == F_INT ? "an integer" : "an object";
}

static int parse(json_t **doc, idem_result *out, const char *body, size_t len,
                 const pay__field *fields, size_t nfields, int key_invalid)
{
	char detail[256];
	json_error_t jerr;
	const char *name;
	json_t *v, *obj;

	*doc = NULL;
	obj = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
	if (obj && json_is_object(obj) && key_invalid) {
		json_decref(obj);
		return pay__reject(
		    out, 400, "invalid_idempotency_key",
		    "the Idempotency-Key must be 1 to 255 printable ASCII characters "
		    "without spaces, bare or as a quoted string");
	}
	if (!obj) {
		/* jansson refuses numbers it cannot hold: that is a range error. */
		if (strstr(jerr.text, "too big") || strstr(jerr.text, "overflow")) {
			snprintf(detail, sizeof(detail), "number out of range at column %d",
			         jerr.column);
			return pay__reject(out, 400, "invalid_request", detail);
		}
		snprintf(detail, sizeof(detail), "%s (line %d, column %d)", jerr.text, jerr.line,
		         jerr.column);
		return pay__reject(out, 400, "invalid_json", detail);
	}
	if (!json_is_object(obj)) {
		json_decref(obj);
		return pay__reject(out, 400, "invalid_json", "the body must be a JSON object");
	}
	json_object_foreach(obj, name, v)
	{
		const pay__field *f = NULL;

		for (size_t i = 0; i < nfields; i++)
			if (strcmp(fields[i].name, name) == 0)
				f = &fields[i];
		if (!f) {
			snprintf(detail, sizeof(detail), "unknown field '%.64s'", name);
			goto reject;
		}
		if ((f->type == F_STRING && !json_is_string(v)) ||
		    (f->type == F_INT && !json_is_integer(v)) ||
		    (f->type == F_OBJECT && !json_is_object(v))) {
			snprintf(detail, sizeof(detail), "'%s' must be %s", f->name,
			         type_name(f->type));
			goto reject;
		}
	}
	for (size_t i = 0; i < nfields; i++)
		if (fields[i].required && !json_object_get(obj, fields[i].name)) {
			snprintf(detail, sizeof(detail), "'%s' is required", fields[i].name);
			goto reject;
		}
	*doc = obj;
	return 0;
reject:
	json_decref(obj);
	return pay__reject(out, 400, "invalid_request", detail);
}

static int valid_status(const char *s)
{
	return strcmp(s, "SUCCESS") == 0 || strcmp(s, "FAILED") == 0 || strcmp(s, "CLOSED") == 0;
}

/* The message for a value that breaks f's rule, or NULL when it keeps it. */
static const char *broken(const pay__field *f, json_t *v)
{
	const char *s = json_string_value(v);

	switch (f->rule) {
	case V_ANY: return NULL;
	case V_NATURAL_KEY:
		return idem_natural_key_validate(s, strlen(s)) < 0
		           ? "'%s' must be 1..64 of A-Z a-z 0-9 _ - ."
		           : NULL;
	case V_ID: return idem_natural_key_validate(s, strlen(s)) < 0 ? "'%s' is malformed" : NULL;
	case V_AMOUNT:
		return pay__valid_amount((int64_t)json_integer_value(v))
		           ? NULL
		           : "'%s' must be an integer from 1 to 10^15 minor units";
	case V_CURRENCY:
		return pay__valid_currency(s) ? NULL : "'%s' must be three upper-case letters";
	case V_CHANNEL:
		return pay__valid_channel_name(s) ? NULL : "'%s' must be 1..32 of a-z 0-9 _ -";
	case V_TEXT255: return strlen(s) > 255 ? "'%s' must be at most 255 bytes" : NULL;
	case V_NOTIFY_STATUS:
		return valid_status(s) ? NULL : "'%s' must be SUCCESS, FAILED or CLOSED";
	}
	return NULL;
}

int pay__parse_request(json_t **doc, idem_result *out, const idem_pay_request *rq,
                       const pay__field *fields, size_t nfields)
{
	char detail[160];
	int rc = parse(doc, out, rq->body, rq->body_len, fields, nfields, rq->key_invalid);

	if (rc < 0 || !*doc)
		return rc;
	for (size_t i = 0; i < nfields; i++) {
		const pay__field *f = &fields[i];
		json_t *v = json_object_get(*doc, f->name);

		if (f->natural && !v) {
			if (rq->key)
				snprintf(detail, sizeof(detail), "'%s' is required", f->name);
			else
				snprintf(detail, sizeof(detail),
				         "send an Idempotency-Key header or a %s", f->name);
			json_decref(*doc);
			*doc = NULL;
			return pay__reject(out, 400,
			                   rq->key ? "invalid_request" : "missing_idempotency_key",
			                   detail);
		}
	}
	for (size_t i = 0; i < nfields; i++) {
		const pay__field *f = &fields[i];
		json_t *v = json_object_get(*doc, f->name);
		const char *why = v ? broken(f, v) : NULL;

		if (why) {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
			snprintf(detail, sizeof(detail), why, f->name);
#pragma GCC diagnostic pop
			json_decref(*doc);
			*doc = NULL;
			return pay__reject(out, 400, "invalid_request", detail);
		}
	}
	return 0;
}

int pay__fingerprint(char out[IDEM_FINGERPRINT_LEN + 1], const idem_pay_request *rq, json_t *doc)
{
	char *canon =
	    json_dumps(doc, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENSURE_ASCII | JSON_ENCODE_ANY);
	int rc;

	if (!canon)
		return idem__error(IDEM_ENOMEM, "cannot serialise the body");
	rc = idem_fingerprint_canonical(out, rq->method, rq->path, canon, strlen(canon));
	free(canon);
	return rc;
}

const char *pay__str(json_t *doc, const char *name)
{
	return json_string_value(json_object_get(doc, name));
}

int64_t pay__int(json_t *doc, const char *name)
{
	return (int64_t)json_integer_value(json_object_get(doc, name));
}

int pay__valid_amount(int64_t amount)
{
	return amount >= 1 && amount <= 1000000000000000LL;
}

int pay__valid_currency(const char *s)
{
	return s && strlen(s) == 3 && s[0] >= 'A' && s[0] <= 'Z' && s[1] >= 'A' && s[1] <= 'Z' &&
	       s[2] >= 'A' && s[2] <= 'Z';
}

int pay__valid_channel_name(const char *s)
{
	size_t n = s ? strlen(s) : 0;

	if (n == 0 || n > IDEM_PAY_CHANNEL_MAX)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_' ||
		      s[i] == '-'))
			return 0;
	return 1;
}

int pay__new_id(char out[IDEM_PAY_ID_SIZE], const char *prefix, int shard)
{
	size_t n = strlen(prefix);
	uint64_t ms = (uint64_t)idem__clock_realtime_ms(NULL) & 0xffffffffffffULL;

	memcpy(out, prefix, n);
	if (shard > 0) {
		/* Same length as a shard 0 id: "s" and three digits take four hex digits' room. */
		snprintf(out + n, 5, "s%03u", (unsigned)shard % 1000u);
		n += 4;
	}
	snprintf(out + n, 13, "%012llx", (unsigned long long)ms);
	return idem__rand_hex(out + n + 12, shard > 0 ? 8 : 10);
}

int64_t pay__now(const idem_pay *pay)
{
	return idem_store_now(pay->store);
}

void pay__time(char out[32], int64_t ms)
{
	time_t secs = (time_t)(ms / 1000);
	struct tm tm;

	size_t n;

	gmtime_r(&secs, &tm);
	n = strftime(out, 32, "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(out + n, 32 - n, ".%03uZ", (unsigned)(ms % 1000) % 1000u);
}

void pay__col_text(char *out, size_t n, const idem_value *col)
{
	size_t len = col->type == IDEM_VAL_TEXT || col->type == IDEM_VAL_BLOB ? col->len : 0;

	if (len >= n)
		len = n - 1;
	if (len)
		memcpy(out, col->p, len);
	out[len] = '\0';
}
