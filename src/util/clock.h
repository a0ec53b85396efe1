/* util/clock.h: wall clock in milliseconds and short sleeps. */
#ifndef IDEM_UTIL_CLOCK_H
#define IDEM_UTIL_CLOCK_H

#include <stdint.h>

int64_t idem__clock_realtime_ms(void *ctx);
int64_t idem__clock_monotonic_us(void);
void idem__sleep_us(int64_t us);

#endif
