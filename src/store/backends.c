/*
 * store/backends.c: the table of URL schemes and the driver behind each,
 * the one place that knows every driver (the engine asks it, core/engine.c).
 * Holds no SQL and never calls into src/core.
 */
#include <string.h>

#include "store/backend.h"

static const struct {
	const char *scheme; /* including the ':' */
	const idem__backend_ops *ops;
} schemes[] = {
    {"sqlite:", &idem__sqlite_ops},     {"postgresql:", &idem__postgres_ops},
    {"postgres:", &idem__postgres_ops}, {"mysql:", &idem__mariadb_ops},
    {"mariadb:", &idem__mariadb_ops},
};

const idem__backend_ops *idem__backend_find(const char *url, const char **target)
{
	for (size_t i = 0; i < sizeof(schemes) / sizeof(schemes[0]); i++) {
		size_t n = strlen(schemes[i].scheme);

		if (strncmp(url, schemes[i].scheme, n) == 0) {
			*target = url + n;
			return schemes[i].ops;
		}
	}
	*target = NULL;
	return NULL;
}
