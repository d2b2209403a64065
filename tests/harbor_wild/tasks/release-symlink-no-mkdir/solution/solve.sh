#!/bin/bash
set -e
ln -sfn /srv/www/releases/v3 /srv/www/current
echo "deployed v3" >> /srv/www/deploy.log
