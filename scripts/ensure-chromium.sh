#!/usr/bin/env bash
# Install Debian's headless Chromium for the HTML report tests when it is missing and we may (root + apt).
# Without it those tests skip with a printed reason.
command -v chromium >/dev/null 2>&1 && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing chromium for the report tests (apt-get)..."
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "could not install chromium: report rendering tests will be skipped"
else
  echo "chromium not found and not root: report rendering tests will be skipped"
fi
