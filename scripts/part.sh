#!/bin/sh
# The bookends of one part of `make test` (or a long step of `make demo`):
#   part.sh begin NAME ESTIMATE    prints the step and its estimate
#   part.sh end NAME RC START      prints the result and how long it took
# Under `make test`, KVROUTE_TEST_SUMMARY names a file: end records the
# part there and exits 0 so the next part still runs (test-summary.sh
# reports them all and fails the run); otherwise end exits with RC, so
# `make test-main` alone fails as before.
set -u
case "$1" in
begin)
	printf '\n==> %s: %s (started %s)\n' "$2" "$3" "$(date +%H:%M:%S)"
	;;
end)
	name=$2 rc=$3 start=$4
	secs=$(($(date +%s) - start))
	took=$(printf '%dm%02ds' $((secs / 60)) $((secs % 60)))
	if [ "$rc" = 0 ]; then result=ok; else result="FAILED (exit $rc)"; fi
	printf '<== %s: %s after %s\n' "$name" "$result" "$took"
	if [ -n "${KVROUTE_TEST_SUMMARY:-}" ]; then
		printf '%s\t%s\t%s\n' "$name" "$result" "$took" >>"$KVROUTE_TEST_SUMMARY"
		exit 0
	fi
	exit "$rc"
	;;
*)
	echo "usage: part.sh begin NAME ESTIMATE | end NAME RC START" >&2
	exit 2
	;;
esac
