#!/usr/bin/env bash
# Machine-check the proofs in proofs/coq:
#   (a) install Coq + MathComp (Debian packages) when missing,
#   (b) reject forbidden vernacular (unfinished proofs, postulates),
#   (c) build with make,
#   (d) print the assumptions of every main theorem and require each one to
#       be "Closed under the global context".
# Exit status is non-zero on any failure.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
coqdir="$here/coq"
closed="Closed under the global context"

say() { printf '%s\n' "$*"; }
die() { printf 'check.sh: FAIL: %s\n' "$*" >&2; exit 1; }

# ---- (a) toolchain -----------------------------------------------------------
have_mathcomp() {
  command -v coqc >/dev/null 2>&1 || return 1
  local where
  where="$(coqc -where 2>/dev/null)" || return 1
  [ -f "$where/user-contrib/mathcomp/algebra/ssrnum.vo" ]
}

if ! have_mathcomp; then
  say "== installing Coq and MathComp (apt)"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 && SUDO="sudo" || die "coqc missing and not root (no sudo)"
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq >/dev/null
  $SUDO apt-get install -y -qq coq libcoq-mathcomp-ssreflect libcoq-mathcomp-algebra >/dev/null
  have_mathcomp || die "Coq/MathComp still not available after apt-get install"
fi
say "== $(coqc --version | head -n 1)"

# ---- (b) forbidden words -----------------------------------------------------
shopt -s nullglob
vfiles=("$coqdir"/*.v)
[ "${#vfiles[@]}" -gt 0 ] || die "no .v files in $coqdir"
if grep -nwE 'Admitted|admit|Axiom|Axioms|Parameter|Parameters|Conjecture' "${vfiles[@]}"; then
  die "forbidden word (Admitted/admit/Axiom/Parameter/Conjecture) in a .v file"
fi
say "== no Admitted / admit / Axiom / Parameter / Conjecture in ${#vfiles[@]} files"

# ---- (c) build ---------------------------------------------------------------
say "== building"
make -C "$coqdir" lib || die "build failed"

# ---- (d) assumptions ---------------------------------------------------------
say "== Print Assumptions"
mapfile -t names < <(sed -n 's/^[[:space:]]*Print Assumptions[[:space:]]\+\([^.[:space:]]*\)[[:space:]]*\.[[:space:]]*$/\1/p' "$coqdir/Assumptions.v")
[ "${#names[@]}" -gt 0 ] || die "no 'Print Assumptions' in Assumptions.v"

out="$(cd "$coqdir" && coqc -q -Q . SpecSample \
        -w -notation-overridden,-ambiguous-paths,-notation-incompatible-format,-redundant-canonical-projection \
        Assumptions.v)" || die "Assumptions.v does not compile"

mapfile -t lines < <(printf '%s\n' "$out" | sed '/^[[:space:]]*$/d')
if [ "${#lines[@]}" -ne "${#names[@]}" ]; then
  printf '%s\n' "$out"
  die "expected ${#names[@]} lines of Print Assumptions output, got ${#lines[@]} (some theorem depends on an assumption)"
fi
bad=0
for i in "${!names[@]}"; do
  say "${names[$i]}: ${lines[$i]}"
  [ "${lines[$i]}" = "$closed" ] || bad=1
done
[ "$bad" -eq 0 ] || die "some theorem is not closed under the global context"

say "== OK: ${#names[@]} theorems, all closed under the global context"
