#!/bin/bash

fail() {
  echo "FAIL: $*"
  echo 0 > /logs/verifier/reward.txt
  exit 0
}

[ -L /srv/www/current ] || fail "/srv/www/current is not a symlink"
[ "$(readlink /srv/www/current)" = "/srv/www/releases/v3" ] || fail "current -> $(readlink /srv/www/current)"
grep -q '<h1>v3</h1>' /srv/www/current/index.html || fail "v3 content not served"
[ "$(head -n 2 /srv/www/deploy.log)" = "$(printf 'deployed v1\ndeployed v2')" ] || fail "old log lines lost"
[ "$(tail -n 1 /srv/www/deploy.log)" = "deployed v3" ] || fail "deploy.log not appended"

echo PASS
echo 1 > /logs/verifier/reward.txt
