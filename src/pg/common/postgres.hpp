// The one way C++ files include PostgreSQL: C linkage, postgres.h first.
#pragma once

extern "C" {
#include "postgres.h"

#include "fmgr.h"
#if PG_VERSION_NUM >= 160000
#include "varatt.h"  // VARDATA and friends left postgres.h in 16
#endif
}
