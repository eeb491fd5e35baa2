#!/usr/bin/env bash
# Regenerates every figure and table quoted in README.md and docs/*.md (about 15 minutes).
set -euo pipefail
cd "$(dirname "$0")/../.."
C=${CONDUCTOR:-.venv/bin/conductor}
R=docs/results
$C compare --json $R/compare_1x.json --markdown $R/compare_1x.md --plot $R/compare_1x.png
$C compare --speed 2 --json $R/compare_2x.json --markdown $R/compare_2x.md --plot $R/compare_2x.png
$C compare --speed 2 --admission early --json $R/compare_2x_early.json --markdown $R/compare_2x_early.md
$C compare --policies mooncake --unbounded-cache --json $R/cache_unbounded.json --markdown $R/cache_unbounded.md
$C trace stats > $R/trace_stats.txt
$C compare --speed 2 --policies mooncake --admissions off,baseline,early,reserve,predictive --json $R/admission_8p8d.json --markdown $R/admission_8p8d.md
$C compare --speed 2 --decode 3 --policies mooncake --admissions off,baseline,early,reserve,predictive --json $R/admission_8p3d.json --markdown $R/admission_8p3d.md
$C compare --speed 2 --decode 3 --policies mooncake --admissions early,reserve,predictive --oracle-lengths --no-bundle --json $R/admission_8p3d_oracle.json --markdown $R/admission_8p3d_oracle.md
$C simulate --speed 2 --decode 3 --policy mooncake --admission baseline --load-plot $R/load_8p3d_baseline.png --json $R/load_8p3d_baseline.json
$C simulate --speed 2 --decode 3 --policy mooncake --admission early --load-plot $R/load_8p3d_early.png --json $R/load_8p3d_early.json
$C simulate --policy conductor --no-cpp --json $R/cpp_off.json
$C simulate --policy conductor --cpp --json $R/cpp_on.json
$C simulate --policy mooncake --load-plot $R/replicas_mooncake.png --json $R/replicas_mooncake.json
$C simulate --policy mooncake --replication --json $R/replication_on.json
for kind in chat agent docqa mixed; do
  $C trace synth --kind $kind --requests 2000 --rate 2.5 --seed 42 --out $R/synth_$kind.jsonl
  $C compare --trace $R/synth_$kind.jsonl --json $R/compare_synth_$kind.json --markdown $R/compare_synth_$kind.md
done
# chat and agent barely load the cluster at 2.5 req/s: replay them 16x faster as well
for kind in chat agent; do
  $C compare --trace $R/synth_$kind.jsonl --speed 16 --json $R/compare_synth_${kind}_16x.json --markdown $R/compare_synth_${kind}_16x.md
done
rm -f $R/synth_*.jsonl
$C capacity --bisect-steps 3 --json $R/capacity.json > $R/capacity.txt
# the Fig. 5 table under other prefill MFUs (the preset's fit to Splitwise's A100 profile is 0.375)
${PYTHON:-.venv/bin/python} bench/fig5_mfu.py --out $R --mfus 0.35,0.375,0.42,0.5
# engines off the cost model (sigma 0.3, +30%): corrected online vs not, beside two references
${PYTHON:-.venv/bin/python} bench/cost_error.py --out $R
