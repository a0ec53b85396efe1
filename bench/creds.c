/*
 * bench/creds.c: merchants and a channel for a run, made the way an
 * operator makes them: `idemctl --db URL merchant add NAME --json` and
 * `idemctl --db URL channel add NAME --json`, run without a shell (the URL
 * may hold a password with any character). The secrets it reads stay in
 * memory; they are never printed.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

/* Runs argv, its stdout parsed as one JSON object into *out; 0 or -1. */
static int run_json(char *const argv[], json_t **out, char *err, size_t errlen)
{
	char buf[8192];
	size_t got = 0;
	int fds[2] = {-1, -1}, status = 0, rc = -1;
	pid_t pid;
	json_error_t je;

	*out = NULL;
	if (pipe(fds) < 0) {
		snprintf(err, errlen, "pipe: %s", strerror(errno));
		return -1;
	}
	if ((pid = fork()) < 0) {
		snprintf(err, errlen, "fork: %s", strerror(errno));
		goto done;
	}
	if (pid == 0) {
		dup2(fds[1], 1);
		close(fds[0]);
		close(fds[1]);
		execvp(argv[0], argv);
		_exit(127);
	}
	close(fds[1]);
	fds[1] = -1;
	for (;;) {
		ssize_t n = read(fds[0], buf + got, sizeof(buf) - 1 - got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += (size_t)n;
		if (got == sizeof(buf) - 1)
			break;
	}
	buf[got] = '\0';
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		snprintf(err, errlen, "%s %s %s failed (exit %d)", argv[0], argv[3], argv[4],
		         WIFEXITED(status) ? WEXITSTATUS(status) : -1);
		goto done;
	}
	if (!(*out = json_loads(buf, 0, &je)) || !json_is_object(*out)) {
		snprintf(err, errlen, "%s %s printed no JSON object", argv[0], argv[3]);
		json_decref(*out);
		*out = NULL;
		goto done;
	}
	rc = 0;
done:
	if (fds[0] >= 0)
		close(fds[0]);
	if (fds[1] >= 0)
		close(fds[1]);
	return rc;
}

static int copy_field(json_t *o, const char *name, char *out, size_t outlen)
{
	const char *s = json_string_value(json_object_get(o, name));

	if (!s || strlen(s) >= outlen)
		return -1;
	snprintf(out, outlen, "%s", s);
	return 0;
}

int creds_create(bench_config *c, char *err, size_t errlen)
{
	char name[96];
	char *argv[8];
	json_t *o = NULL;
	int rc = -1;

	argv[0] = c->idemctl;
	argv[1] = "--db";
	argv[2] = c->db;
	argv[5] = name;
	argv[6] = "--json";
	argv[7] = NULL;
	for (int i = 0; i < c->nmerchants; i++) {
		snprintf(name, sizeof(name), "bench-%s-%d", c->run_id, i);
		argv[3] = "merchant";
		argv[4] = "add";
		if (run_json(argv, &o, err, errlen) < 0)
			goto done;
		if (copy_field(o, "merchant_id", c->merchants[i].id, sizeof(c->merchants[i].id)) <
		        0 ||
		    copy_field(o, "api_key", c->merchants[i].key, sizeof(c->merchants[i].key)) <
		        0) {
			snprintf(err, errlen, "idemctl merchant add: no merchant_id/api_key");
			goto done;
		}
		json_decref(o);
		o = NULL;
	}
	if (!c->channel_secret[0]) {
		snprintf(c->channel, sizeof(c->channel), "bench-%s", c->run_id);
		for (char *p = c->channel; *p; p++)
			if (*p >= 'A' && *p <= 'Z')
				*p = (char)(*p - 'A' + 'a');
		snprintf(name, sizeof(name), "%s", c->channel);
		argv[3] = "channel";
		argv[4] = "add";
		if (run_json(argv, &o, err, errlen) < 0)
			goto done;
		if (copy_field(o, "secret", c->channel_secret, sizeof(c->channel_secret)) < 0) {
			snprintf(err, errlen, "idemctl channel add: no secret");
			goto done;
		}
	}
	rc = 0;
done:
	json_decref(o);
	return rc;
}
