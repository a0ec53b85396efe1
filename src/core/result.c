/*
 * core/result.c: the answer types' small helpers (outcome names, freeing a
 * result or a record's info, setting a unit's response). The bottom of
 * src/core: everything may call these; they call nothing of the library
 * but the error detail.
 */
#include <stdlib.h>
#include <string.h>

#include "idem/claim.h"
#include "util/error.h"

const char *idem_outcome_name(idem_outcome o)
{
	switch (o) {
	case IDEM_FIRST: return "first";
	case IDEM_REPLAY: return "replay";
	case IDEM_IN_PROGRESS: return "in_progress";
	case IDEM_MISMATCH: return "mismatch";
	}
	return "error";
}

void idem_result_clear(idem_result *res)
{
	if (!res)
		return;
	free(res->body);
	memset(res, 0, sizeof(*res));
}

int idem_response_set(idem_response *resp, int http_status, const void *body, size_t len)
{
	unsigned char *copy = NULL;

	IDEM__ASSERT_ARG(resp);
	IDEM__ASSERT_ARG(body || len == 0);
	if (!(copy = malloc(len ? len : 1)))
		return idem__error(IDEM_ENOMEM, "out of memory");
	if (len)
		memcpy(copy, body, len);
	free(resp->body);
	resp->http_status = http_status;
	resp->body = copy;
	resp->body_len = len;
	return 0;
}

void idem_record_info_clear(idem_record_info *info)
{
	if (!info)
		return;
	free(info->body);
	memset(info, 0, sizeof(*info));
}
