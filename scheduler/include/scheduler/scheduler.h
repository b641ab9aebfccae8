// Umbrella header: the scheduler's whole public API.
#pragma once

#include "scheduler/device.h"
#include "scheduler/dispatcher.h"
#include "scheduler/op.h"
#include "scheduler/policy.h"
#include "scheduler/profile_store.h"
#include "scheduler/trace.h"
