// The one way C++ files include PostgreSQL: C linkage, postgres.h first.
#pragma once

extern "C" {
#include "postgres.h"

#include "fmgr.h"
}
