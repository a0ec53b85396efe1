/*
 * cli/inspect.c: `idemctl inspect SCOPE TYPE KEY`: one idempotency record,
 * the stored response body included, for the operator on the phone with a
 * merchant. Reads only.
 */
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

static json_t *hex_body(const unsigned char *b, size_t n)
{
	char *hex = malloc(2 * n + 1);
	json_t *o;

	if (!hex)
		return NULL;
	for (size_t i = 0; i < n; i++)
		snprintf(hex + 2 * i, 3, "%02x", b[i]);
	hex[2 * n] = '\0';
	o = json_pack("{s:s}", "hex", hex);
	free(hex);
	return o;
}

static int run(const cli_globals *g, int argc, char **argv)
{
	idem_store *store = NULL;
	idem_pay *pay = NULL;
	idem_record_info info;
	char created[32], expires[32], lease[32];
	int rc;

	memset(&info, 0, sizeof(info));
	if (argc != 3)
		return cli_usage_error("inspect takes MERCHANT TYPE KEY");
	if (idem_key_validate(argv[2], strlen(argv[2])) < 0)
		return cli_usage_error("KEY must be 1..255 bytes of 0x21..0x7E");
	if ((rc = cli_open(g, &store, &pay)) != 0)
		return rc;
	{
		/* Sharded: the record is on the merchant's shard (a channel's scope,
		 * for notifications, is looked up on shard 0). */
		int shard = 0;

		if (idem_pay_merchant_shard(pay, argv[0], &shard) == 0 && shard < cli_nstores)
			store = cli_stores[shard];
	}
	rc = idem_record_get(&info, store, argv[0], argv[1], argv[2], strlen(argv[2]));
	if (rc == IDEM_ENOTFOUND || rc == IDEM_EINVAL) {
		fprintf(stderr, "idemctl: no record for scope '%s', type '%s', key '%s'\n", argv[0],
		        argv[1], argv[2]);
		rc = 1;
		goto done;
	}
	if (rc < 0) {
		rc = cli_fail("cannot read the record", rc);
		goto done;
	}
	cli_time(created, info.created_at_ms);
	cli_time(expires, info.expires_at_ms);
	cli_time(lease, strcmp(info.status, "PROCESSING") == 0 ? info.lease_until_ms : 0);
	if (g->json) {
		json_t *body =
		    info.body ? json_stringn((const char *)info.body, info.body_len) : json_null();

		if (!body) /* not UTF-8 text: keep it exact, as hex, rather than lose it */
			body = hex_body(info.body, info.body_len);
		rc = cli_print_json(json_pack(
		    "{s:s, s:s, s:s, s:s, s:o, s:s, s:s, s:s, s:s?, s:o}", "scope", argv[0],
		    "business_type", argv[1], "key", argv[2], "status", info.status, "http_status",
		    info.http_status ? json_integer(info.http_status) : json_null(), "fingerprint",
		    info.fingerprint, "created_at", created, "expires_at", expires, "lease_until",
		    strcmp(lease, "-") ? lease : NULL, "body", body));
	} else {
		printf("scope          %s\nbusiness_type  %s\nkey            %s\n", argv[0],
		       argv[1], argv[2]);
		printf("status         %s\n", info.status);
		if (info.http_status)
			printf("http_status    %d\n", info.http_status);
		printf("fingerprint    %s\ncreated_at     %s\nexpires_at     %s\n",
		       info.fingerprint, created, expires);
		if (strcmp(lease, "-") != 0)
			printf("lease_until    %s\n", lease);
		printf("body (%zu bytes):\n", info.body_len);
		if (info.body_len)
			fwrite(info.body, 1, info.body_len, stdout);
		printf("\n");
	}
done:
	idem_record_info_clear(&info);
	cli_close(store, pay);
	return rc;
}

const cli_command cli_inspect = {
    "inspect",
    "show one idempotency record with its stored response",
    "inspect MERCHANT TYPE KEY [--json]\n\n"
    "Shows the record of (MERCHANT, TYPE, KEY): status, HTTP status, fingerprint,\n"
    "times and the stored response body, byte for byte. MERCHANT is the scope: a\n"
    "merchant id, or a channel name for the notification and recon types.\n"
    "Exits 1 when there is no such record.\n"
    "--json prints {\"scope\", \"business_type\", \"key\", \"status\", \"http_status\",\n"
    "\"fingerprint\", \"created_at\", \"expires_at\", \"lease_until\", \"body\"}.\n\n"
    "example:\n  idemctl --db sqlite:var/idem.db inspect m_0123abcd payment ORDER-1\n",
    run,
};
