/*
 * tests/fuzz/replay.c: main() for the corpus replay in the normal build
 * (ctest fuzz_replay_<target>). Runs LLVMFuzzerTestOneInput once per file of
 * each directory or file argument, in name order, and says how many ran;
 * the libFuzzer binaries of `make fuzz` do the same with -runs=0.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_env.h"

#define REPLAY_MAX (1u << 20)

static int run_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf = malloc(REPLAY_MAX);
	size_t n;

	if (!f || !buf) {
		fprintf(stderr, "replay: cannot read %s\n", path);
		free(buf);
		if (f)
			fclose(f);
		return -1;
	}
	n = fread(buf, 1, REPLAY_MAX, f);
	fclose(f);
	/* An exact-size copy, so ASan sees a read past the end as libFuzzer would. */
	{
		uint8_t *exact = malloc(n ? n : 1);

		if (!exact) {
			free(buf);
			return -1;
		}
		memcpy(exact, buf, n);
		free(buf);
		LLVMFuzzerTestOneInput(exact, n);
		free(exact);
	}
	return 0;
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
	return strcmp((*a)->d_name, (*b)->d_name);
}

int main(int argc, char **argv)
{
	long count = 0;

	for (int i = 1; i < argc; i++) {
		struct stat st;
		struct dirent **names = NULL;
		int n;

		if (stat(argv[i], &st) != 0) {
			fprintf(stderr, "replay: no such file or directory: %s\n", argv[i]);
			return 1;
		}
		if (!S_ISDIR(st.st_mode)) {
			if (run_file(argv[i]) < 0)
				return 1;
			count++;
			continue;
		}
		if ((n = scandir(argv[i], &names, NULL, by_name)) < 0) {
			fprintf(stderr, "replay: cannot list %s\n", argv[i]);
			return 1;
		}
		for (int k = 0; k < n; k++) {
			char path[4096];

			if (names[k]->d_name[0] != '.') {
				snprintf(path, sizeof(path), "%s/%s", argv[i], names[k]->d_name);
				if (run_file(path) < 0)
					return 1;
				count++;
			}
			free(names[k]);
		}
		free(names);
	}
	printf("replay: %ld inputs, no crash\n", count);
	/* A replay that ran nothing proves nothing. */
	return count > 0 ? 0 : 1;
}
