#!/bin/sh
# The report in a real browser: runs test_sweep's [browser] cases, which render reports with
# headless Chromium. Exit 77 (ctest: skipped) where there is no Chromium; tools/setup.sh
# installs Debian's `chromium` where it can.
# usage: browser_test.sh TEST_SWEEP
for b in chromium chromium-browser google-chrome; do
  if command -v "$b" > /dev/null 2>&1; then
    ISORUN_TEST_BROWSER=$(command -v "$b") exec "$1" "[browser]"
  fi
done
echo "no Chromium (chromium, chromium-browser or google-chrome) on PATH: the browser checks are skipped"
exit 77
