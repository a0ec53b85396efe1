/*
 * idem/idem.h: the whole public API of libidem. Include this one.
 */
#ifndef IDEM_H
#define IDEM_H

#include "claim.h"
#include "common.h"
#include "metrics.h"
#include "pay.h"
#include "store.h"
#include "util.h"

#define IDEM_VERSION "0.1.0"

#endif
