#!/usr/bin/env bash
# Sourced by the launchers: a launcher variable that must be a number is refused by its name before anything runs
# (bash arithmetic would read `QUESTIONS_PER_STEP=abc` as the name of an unset variable: "abc: unbound variable").
#   need_count NAME...    whole numbers, 0 or more (counts, sizes, lengths)
#   need_int NAME...      whole numbers, negative too (verl's -1: never)
#   need_number NAME...   decimal numbers (1e-6, 0.2, 3)

_refuse_number() {
  echo "error: $1=${!1}: expected $2; unset it for the default, or see the launcher's variables in docs/algo/diva_grpo.md#launcher" >&2
  exit 2
}
need_count() {
  local name
  for name in "$@"; do [[ "${!name}" =~ ^[0-9]+$ ]] || _refuse_number "$name" "a whole number (0, 1, 2, ...)"; done
}
need_int() {
  local name
  for name in "$@"; do [[ "${!name}" =~ ^-?[0-9]+$ ]] || _refuse_number "$name" "a whole number (-1 for never)"; done
}
need_number() {
  local name
  for name in "$@"; do
    [[ "${!name}" =~ ^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$ ]] || _refuse_number "$name" "a number (e.g. 0.2, 1e-6)"
  done
}
