#!/usr/bin/env bash
# Regenerates every figure and table quoted in README.md and docs/*.md (about 40 minutes on 2 cores).
# Every comparison runs all policies under one admission mode and one CPP setting (compare's
# default: early rejection for all, CPP off), plus conductor's own bundle as one labelled row.
# The scheduler never sees output lengths (--max-tokens none) unless a file says "oracle".
set -euo pipefail
cd "$(dirname "$0")/../.."
C=${CONDUCTOR:-.venv/bin/conductor}
PY=${PYTHON:-.venv/bin/python}
R=docs/results
# FAST Fig. 5: placement alone (no admission, as in the paper)
$C compare --admission off --policies random,least_loaded,cache_aware_local,mooncake --no-bundle --json $R/fig5.json --markdown $R/fig5.md
$C compare --policies mooncake --admission off --no-bundle --unbounded-cache --json $R/cache_unbounded.json --markdown $R/cache_unbounded.md
$C trace stats > $R/trace_stats.txt
# every policy, equal footing: early for all (default), and the placement-only view
$C compare --json $R/compare_1x.json --markdown $R/compare_1x.md --plot $R/compare_1x.png
$C compare --speed 2 --json $R/compare_2x.json --markdown $R/compare_2x.md --plot $R/compare_2x.png
$C compare --admission off --json $R/compare_1x_off.json --markdown $R/compare_1x_off.md
$C compare --speed 2 --admission off --json $R/compare_2x_off.json --markdown $R/compare_2x_off.md
# ablation: the oracle output lengths the scheduler used to see
$C compare --speed 2 --oracle-lengths --json $R/compare_2x_oracle.json --markdown $R/compare_2x_oracle.md
# admission modes, one policy
$C compare --speed 2 --policies mooncake,conductor --admissions off,baseline,early,reserve,predictive --no-bundle --json $R/admission_8p8d.json --markdown $R/admission_8p8d.md
$C compare --speed 2 --decode 3 --policies mooncake,conductor --admissions off,baseline,early,reserve,predictive --no-bundle --json $R/admission_8p3d.json --markdown $R/admission_8p3d.md
$C compare --speed 2 --decode 3 --policies mooncake,conductor --admissions early,reserve,predictive --oracle-lengths --no-bundle --json $R/admission_8p3d_oracle.json --markdown $R/admission_8p3d_oracle.md
$C simulate --speed 2 --decode 3 --policy mooncake --admission baseline --load-plot $R/load_8p3d_baseline.png --json $R/load_8p3d_baseline.json
$C simulate --speed 2 --decode 3 --policy mooncake --admission early --load-plot $R/load_8p3d_early.png --json $R/load_8p3d_early.json
$C simulate --policy conductor --no-cpp --json $R/cpp_off.json
$C simulate --policy conductor --cpp --json $R/cpp_on.json
$C simulate --policy mooncake --load-plot $R/replicas_mooncake.png --json $R/replicas_mooncake.json
$C simulate --policy mooncake --replication --json $R/replication_on.json
# generated workloads (parameters never fitted to these)
for kind in chat agent docqa mixed; do
  $C trace synth --kind $kind --requests 2000 --rate 2.5 --seed 42 --out $R/synth_$kind.jsonl
  $C compare --trace $R/synth_$kind.jsonl --json $R/compare_synth_$kind.json --markdown $R/compare_synth_$kind.md
done
# chat and agent barely load the cluster at 2.5 req/s: replay them 16x faster as well;
# docqa and mixed at 2x (where the best peer is near 90% attainment)
for kind in chat agent; do
  $C compare --trace $R/synth_$kind.jsonl --speed 16 --json $R/compare_synth_${kind}_16x.json --markdown $R/compare_synth_${kind}_16x.md
done
for kind in docqa mixed; do
  $C compare --trace $R/synth_$kind.jsonl --speed 2 --json $R/compare_synth_${kind}_2x.json --markdown $R/compare_synth_${kind}_2x.md
done
# the vLLM P/D protocol (the decode engine's first token, docs/simulator.md), every policy,
# the scheduler told (SchedulerConfig.first_token): the same workloads
D="--first-token decode"
$C compare $D --json $R/compare_1x_decode_first.json --markdown $R/compare_1x_decode_first.md
$C compare $D --speed 2 --json $R/compare_2x_decode_first.json --markdown $R/compare_2x_decode_first.md
for kind in chat agent docqa mixed; do
  $C compare $D --trace $R/synth_$kind.jsonl --json $R/compare_synth_${kind}_decode_first.json --markdown $R/compare_synth_${kind}_decode_first.md
done
for ks in chat:16 agent:16 docqa:2 mixed:2; do
  kind=${ks%:*}; x=${ks#*:}
  $C compare $D --trace $R/synth_$kind.jsonl --speed $x --json $R/compare_synth_${kind}_${x}x_decode_first.json --markdown $R/compare_synth_${kind}_${x}x_decode_first.md
done
rm -f $R/synth_*.jsonl
$C capacity --bisect-steps 3 --tbt-slos-ms 100 --json $R/capacity.json > $R/capacity.txt
# the Fig. 5 table under other prefill MFUs (the preset's fit to Splitwise's A100 profile is 0.375)
$PY bench/fig5_mfu.py --out $R --mfus 0.35,0.375,0.42,0.5
# engines off the cost model (sigma 0.3, +30%): corrected online vs not, beside two references
$PY bench/cost_error.py --out $R
# held-out: fresh seeds and settings no parameter was chosen on (docs/results.md 3b)
$PY bench/heldout.py --json $R/heldout.json
