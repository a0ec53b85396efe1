/*
 * tests/fuzz/fuzz_env.h: what the fuzz targets share: one real SQLite store
 * (a temp file, removed at exit) with the payment schema, one merchant and
 * one channel, opened on first use and kept for the whole run.
 */
#ifndef IDEM_FUZZ_ENV_H
#define IDEM_FUZZ_ENV_H

#include <stddef.h>
#include <stdint.h>

#include "idem/idem.h"

typedef struct {
	idem_store *store;
	idem_pay *pay;
	char merchant[IDEM_PAY_ID_SIZE];
	char api_key[IDEM_PAY_SECRET_SIZE];
	char channel[IDEM_PAY_CHANNEL_MAX + 1];
	char secret[IDEM_PAY_SECRET_SIZE];
	char merchant2[IDEM_PAY_ID_SIZE]; /* a second merchant, for transfers */
	char payment[IDEM_PAY_ID_SIZE];   /* a succeeded payment of 100000 CNY of merchant */
} fuzz_env;

/* The shared environment; aborts (a finding, not a skip) when it cannot open. */
fuzz_env *fuzz_env_get(void);

/*
 * Seeds cannot know the ids of a run: replace @KEY@ (the API key),
 * @MERCHANT@, @M2@, @PAY@ and @CH@ in data[0..size) with this run's values.
 * Returns a malloc'd NUL-terminated copy, its length in *len. Caller frees.
 */
char *fuzz_subst(const uint8_t *data, size_t size, size_t *len);

/* A NUL-terminated copy of data[0..size) (may hold earlier NULs). Caller frees. */
char *fuzz_strndup(const uint8_t *data, size_t size);

/* Abort with a message: the fuzzer records the input as a crash. */
void fuzz_fail(const char *what) __attribute__((noreturn));

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
