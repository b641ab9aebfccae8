// Included by the generated driver_wrappers.cpp only.
#pragma once

#include "driver_functions.h"
#include "wrapper_support.h"
