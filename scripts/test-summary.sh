#!/bin/sh
# Prints the table of `make test`'s parts that scripts/part.sh recorded in
# FILE, removes FILE, and exits non-zero if any part failed.
set -u
file=$1
[ -f "$file" ] || { echo "test summary: no part recorded a result ($file)" >&2; exit 1; }
printf '\nmake test summary\n'
printf '  %-22s %-20s %s\n' part result time
awk -F '\t' '{printf "  %-22s %-20s %s\n", $1, $2, $3}' "$file"
failed=$(awk -F '\t' '$2 != "ok" {print $1}' "$file" | tr '\n' ' ')
rm -f "$file"
if [ -n "$failed" ]; then
	printf 'make test: FAILED: %s(each part'"'"'s output is above, between its ==> and <== lines)\n' "$failed"
	exit 1
fi
echo "make test: every part passed"
