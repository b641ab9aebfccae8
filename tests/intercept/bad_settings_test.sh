#!/usr/bin/env bash
# The shim refuses bad settings at its first driver call: exit 2, and the message names the
# environment variable the value came from (intercept/README.md: "libgpu_scheduler:
# <VARIABLE>='<value>': ..."), for the values checked by the scheduling core too (the policy's
# name and parameters, the imported profile CSV). Runs PROGRAM (any test program that calls the
# driver) under the ctest environment (LD_PRELOAD of the shim, the fake driver).
# Usage: bad_settings_test.sh PROGRAM
set -uo pipefail
program=$1
failures=0
expect() {  # expect PATTERN VAR=VALUE...
  local pattern=$1; shift
  local out rc
  out=$(env USE_ORION_SCHEDULER=1 "$@" "$program" 2>&1); rc=$?
  if [ $rc -ne 2 ] || ! grep -q -- "$pattern" <<<"$out"; then
    echo "FAIL $*: exit $rc, wanted 2 and '$pattern' in:"; tail -n 5 <<<"$out" | sed 's/^/  | /'
    failures=$((failures + 1))
  else
    echo "ok   $*: $(grep -m1 -- "$pattern" <<<"$out")"
  fi
}
expect "libgpu_scheduler: ORION_POLICY='bogus': unknown scheduling policy 'bogus'" ORION_POLICY=bogus
expect "libgpu_scheduler: ORION_POLICY='orion' ORION_POLICY_PARAMS='bogus=1': policy 'orion': unknown parameter 'bogus'" \
  ORION_POLICY=orion ORION_POLICY_PARAMS=bogus=1
expect "libgpu_scheduler: ORION_PROFILE_IMPORT='/nonexistent/profile.csv': " ORION_PROFILE_IMPORT=/nonexistent/profile.csv
expect "libgpu_scheduler: ORION_TRACE='/nonexistent/trace.json': the folder '/nonexistent' does not exist" \
  ORION_TRACE=/nonexistent/trace.json
exit $((failures > 0))
