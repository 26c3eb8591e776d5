#!/usr/bin/env bash
# Installs the system packages the embedded stack needs, and only those that are missing:
# a JDK 17 (Spark, and javac for the Avro interoperability test), Maven (scripts/jars.sh resolves
# the JVM artifacts with it), the PostgreSQL server, and
# Docker Compose (a test validates docker/compose.yml; it needs no Docker engine), and Chromium
# (a test opens each service's status page headless, as a person would see it).
# The Cloud Spanner emulator is not in Debian's archive: when it is missing this says so and
# how to get it; the stack then falls back to SPANNER_EMULATOR_HOST or a container.
#
# `system-deps.sh build` checks only what building the package needs: a C compiler and Python's
# headers (spanner_cdc/**/*.pyx are compiled when the package is installed).
set -euo pipefail

missing=()
command -v cc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
if ! "${PYTHON:-python3}" -c 'import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' 2>/dev/null; then
  missing+=(python3-dev)
fi
if [ "${1:-}" != build ]; then
  command -v javac >/dev/null 2>&1 || missing+=(openjdk-17-jdk-headless)
  command -v mvn >/dev/null 2>&1 || missing+=(maven)
  pg_bindir=$( (pg_config --bindir 2>/dev/null) || true)
  if [ ! -x "$pg_bindir/initdb" ] && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    missing+=(postgresql)
  fi
  if ! docker compose version >/dev/null 2>&1 && ! command -v docker-compose >/dev/null 2>&1; then
    missing+=(docker-compose)
  fi
  command -v chromium >/dev/null 2>&1 || missing+=(chromium)
fi

if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "system-deps: missing ${missing[*]}; run: sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  echo "system-deps: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

[ "${1:-}" = build ] && exit 0
sdk_root=$( (gcloud info --format='value(installation.sdk_root)' 2>/dev/null) || true)
if [ -z "${SPANNER_EMULATOR_HOST:-}" ] && [ ! -x "$sdk_root/bin/cloud_spanner_emulator/gateway_main" ]; then
  echo "system-deps: warning: the Cloud Spanner emulator is not installed (Debian package" \
       "google-cloud-cli-spanner-emulator from Google Cloud's apt repository); set" \
       "SPANNER_EMULATOR_HOST or run a Docker engine, or the integration tests will fail." >&2
fi
