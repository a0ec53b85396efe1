/*
 * cli/util.c: what idemctl's commands share: option values, numbers and
 * durations parsed with full checks, JSON output, the frame of the `list`
 * commands (header, rows, count), and a progress line that is drawn only on
 * a terminal (a pipe or a log file never sees it).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"

int cli_usage_error(const char *fmt, ...)
{
	va_list ap;

	fputs("idemctl: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs(" (see --help)\n", stderr);
	return EXIT_USAGE;
}

int cli_parse_long(const char *s, long min, long max, long *out)
{
	char *end = NULL;
	long v;

	if (!s || !*s)
		return -1;
	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < min || v > max)
		return -1;
	*out = v;
	return 0;
}

int cli_parse_duration_ms(const char *s, int64_t *out)
{
	static const struct {
		const char *unit;
		int64_t ms;
	} units[] = {{"", 1000},   {"ms", 1},      {"s", 1000},
	             {"m", 60000}, {"h", 3600000}, {"d", 86400000}};
	char *end = NULL;
	long long v;

	if (!s || !*s)
		return -1;
	errno = 0;
	v = strtoll(s, &end, 10);
	if (errno || end == s || v <= 0)
		return -1;
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++)
		if (strcmp(end, units[i].unit) == 0) {
			if (v > INT64_MAX / units[i].ms)
				return -1;
			*out = v * units[i].ms;
			return 0;
		}
	return -1;
}

const char *cli_opt_value(int argc, char **argv, int *i, const char *name, int *missing)
{
	size_t n = strlen(name);
	const char *a = argv[*i];

	*missing = 0;
	if (strncmp(a, name, n) != 0)
		return NULL;
	if (a[n] == '=')
		return a + n + 1;
	if (a[n] != '\0')
		return NULL;
	if (*i + 1 >= argc) {
		*missing = 1;
		return NULL;
	}
	return argv[++*i];
}

void cli_time(char out[32], int64_t ms)
{
	time_t secs = (time_t)(ms / 1000);
	struct tm tm;
	size_t n;

	if (ms <= 0) {
		snprintf(out, 32, "-");
		return;
	}
	gmtime_r(&secs, &tm);
	n = strftime(out, 32, "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(out + n, 32 - n, ".%03uZ", (unsigned)(ms % 1000));
}

int cli_print_json(json_t *obj)
{
	char *s = obj ? json_dumps(obj, JSON_PRESERVE_ORDER | JSON_COMPACT) : NULL;

	json_decref(obj);
	if (!s) {
		fprintf(stderr, "idemctl: out of memory\n");
		return 1;
	}
	printf("%s\n", s);
	free(s);
	return 0;
}

static int64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void cli_progress_start(cli_progress *p, const char *label, int64_t total)
{
	memset(p, 0, sizeof(*p));
	p->on = isatty(STDERR_FILENO);
	p->label = label;
	p->total = total;
}

void cli_progress_update(cli_progress *p, int64_t done, const char *extra)
{
	char bar[41];
	int64_t now;

	if (!p->on)
		return;
	now = mono_ms();
	if (now - p->last_draw_ms < 100 && !(p->total > 0 && done >= p->total))
		return;
	p->last_draw_ms = now;
	if (p->total > 0) {
		int64_t d = done > p->total ? p->total : done;
		int fill = (int)(d * 40 / p->total);

		for (int i = 0; i < 40; i++)
			bar[i] = i < fill ? '#' : '.';
		bar[40] = '\0';
		fprintf(stderr, "\r%s [%s] %3d%% %s\033[K", p->label, bar,
		        (int)(d * 100 / p->total), extra ? extra : "");
	} else {
		fprintf(stderr, "\r%s %lld %s\033[K", p->label, (long long)done,
		        extra ? extra : "");
	}
	fflush(stderr);
}

void cli_progress_end(cli_progress *p)
{
	if (!p->on)
		return;
	fputs("\r\033[K", stderr);
	fflush(stderr);
}

int cli_list_run(const cli_globals *g, int argc, const char *noun,
                 int (*list)(idem_pay *pay, idem_admin_entry_fn fn, void *ctx),
                 idem_admin_entry_fn entry, const char *fmt, ...)
{
	idem_store *store = NULL;
	idem_pay *pay = NULL;
	cli_list l = {g->json, NULL, 0};
	char what[64], plural[32];
	va_list ap;
	int rc;

	if (argc != 0)
		return cli_usage_error("%s list takes no arguments", noun);
	snprintf(plural, sizeof(plural), "%ss", noun);
	snprintf(what, sizeof(what), "cannot list %s", plural);
	if ((rc = cli_open(g, &store, &pay)) != 0)
		return rc;
	if (g->json && !(l.list = json_array())) {
		rc = cli_fail(what, IDEM_ENOMEM);
		goto done;
	}
	if (!g->json) {
		va_start(ap, fmt);
		vprintf(fmt, ap);
		va_end(ap);
	}
	if ((rc = list(pay, entry, &l)) < 0) {
		rc = cli_fail(what, rc);
		goto done;
	}
	if (g->json) {
		rc = cli_print_json(json_pack("{s:o}", plural, l.list));
		l.list = NULL;
	} else {
		printf("%lld %s%s\n", (long long)l.n, noun, l.n == 1 ? "" : "s");
	}
done:
	json_decref(l.list);
	cli_close(store, pay);
	return rc;
}
