#!/usr/bin/env bash
# scripts/slurm/*.sbatch without SLURM: fake `srun` and `scontrol` on PATH record how they were
# called. Checks what each script asks srun for (the MPI plugin, the gnmr command line), that a
# failed run is requeued only after a checkpoint it saved and never after gnmr refused it, and
# that the time-limit signal leads to a requeue.
#   check_slurm_scripts.sh REPO_DIR WORK_DIR
set -euo pipefail
repo=$1
work=$2
rm -rf "$work" && mkdir -p "$work/bin"
fail() { echo "check_slurm_scripts: $*" >&2; exit 1; }

# The fake srun: logs its arguments; exits with $FAKE_SRUN_EXIT, or on SIGUSR1 (the trainer
# checkpoints and exits 0) when FAKE_SRUN_WAIT=1.
cat >"$work/bin/srun" <<'FAKE'
#!/usr/bin/env bash
echo "$*" >>"$FAKE_LOG/srun.log"
# FAKE_SRUN_SAVES: a checkpoint directory the run saves before it ends.
[[ -z "${FAKE_SRUN_SAVES:-}" ]] || mkdir -p "$FAKE_SRUN_SAVES"
if [[ "${FAKE_SRUN_WAIT:-0}" == 1 ]]; then
  trap 'exit ${FAKE_SRUN_USR1_EXIT:-0}' USR1
  touch "$FAKE_LOG/srun.started"
  for _ in $(seq 100); do sleep 0.1; done
  exit 9
fi
exit "${FAKE_SRUN_EXIT:-0}"
FAKE
cat >"$work/bin/scontrol" <<'FAKE'
#!/usr/bin/env bash
echo "$*" >>"$FAKE_LOG/scontrol.log"
exit "${FAKE_SCONTROL_EXIT:-0}"
FAKE
chmod +x "$work/bin/srun" "$work/bin/scontrol"

run_job() {  # run_job NAME SCRIPT ARGS... (environment: FAKE_*)
  local name=$1 script=$2
  shift 2
  mkdir -p "$work/$name"
  (cd "$work/$name" && PATH="$work/bin:$PATH" FAKE_LOG="$work/$name" \
    SLURM_SUBMIT_DIR="${SUBMIT_DIR:-$repo}" \
    SLURM_JOB_ID=4242 SLURM_NTASKS=8 SLURM_JOB_NUM_NODES=1 SLURM_CPUS_PER_TASK=4 \
    bash "$repo/scripts/slurm/$script" "$@" >"$work/$name/out.log" 2>&1)
}

# One node of GPUs: no MPI plugin, the cuda backend, each task's cores (srun does not inherit
# sbatch's --cpus-per-task since SLURM 22.05), one run to completion.
run_job gpu gpu-1node.sbatch cfg.json runs/a --set train.steps=10 || fail "gpu-1node exited $?"
grep -q -- "--mpi=none" "$work/gpu/srun.log" || fail "gpu-1node did not ask srun for --mpi=none"
grep -q -- "--cpus-per-task=4" "$work/gpu/srun.log" || fail "srun was not given the task's cores"
grep -q -- "gnmr train --config cfg.json --out runs/a --resume auto --backend cuda --set train.steps=10" \
  "$work/gpu/srun.log" || fail "gpu-1node's gnmr command line: $(cat "$work/gpu/srun.log")"
grep -q "ended with exit status 0" "$work/gpu/out.log" || fail "gpu-1node did not report its end"
[[ ! -e "$work/gpu/scontrol.log" ]] || fail "a complete run was requeued"

# CPU nodes: srun's MPI plugin and the cpu backend.
run_job cpu cpu.sbatch cfg.json runs/b || fail "cpu.sbatch exited $?"
grep -q -- "--mpi=pmix" "$work/cpu/srun.log" || fail "cpu.sbatch did not ask for --mpi=pmix"
grep -q -- "--resume auto --backend cpu$" "$work/cpu/srun.log" ||
  fail "cpu.sbatch's gnmr command line: $(cat "$work/cpu/srun.log")"

# The N-node GPU job needs no MPI plugin either; no arguments is a usage error (exit 2) naming
# the script submitted.
run_job multi train.sbatch cfg.json runs/c || fail "train.sbatch exited $?"
grep -q -- "--mpi=none" "$work/multi/srun.log" || fail "train.sbatch lost its default plugin"
grep -q -- "--resume auto --backend cuda$" "$work/multi/srun.log" ||
  fail "train.sbatch's gnmr command line: $(cat "$work/multi/srun.log")"
status=0
run_job usage train.sbatch || status=$?
[[ $status == 2 ]] || fail "train.sbatch without arguments exited $status, not 2"
status=0
run_job cpu_usage cpu.sbatch || status=$?
[[ $status == 2 ]] || fail "cpu.sbatch without arguments exited $status, not 2 (it ran: $(cat "$work/cpu_usage/srun.log" 2>/dev/null))"
# A --backend among the extra flags replaces the script's own (gnmr takes one).
run_job own_backend train.sbatch cfg.json runs/j --backend cpu || fail "train.sbatch --backend exited $?"
grep -q -- "--resume auto --backend cpu$" "$work/own_backend/srun.log" ||
  fail "an extra --backend: $(cat "$work/own_backend/srun.log")"
grep -q "usage: sbatch scripts/slurm/cpu.sbatch" "$work/cpu_usage/out.log" ||
  fail "cpu.sbatch's usage line: $(cat "$work/cpu_usage/out.log")"
# Submitted from elsewhere: the body is not found, and the message says what to set.
status=0
SUBMIT_DIR=/nonexistent run_job elsewhere gpu-1node.sbatch cfg.json runs/h || status=$?
[[ $status == 2 ]] || fail "a submission from elsewhere exited $status, not 2"
grep -q "GNMR_SLURM_DIR" "$work/elsewhere/out.log" ||
  fail "a submission from elsewhere: $(cat "$work/elsewhere/out.log")"
# CONFIG and RUN_DIR from the environment: every argument is an extra flag.
CONFIG=cfg.json RUN_DIR=runs/f run_job env cpu.sbatch --set train.steps=10 ||
  fail "cpu.sbatch with CONFIG and RUN_DIR in the environment exited $?"
grep -q -- "gnmr train --config cfg.json --out runs/f --resume auto --backend cpu --set train.steps=10$" \
  "$work/env/srun.log" || fail "the environment form's command line: $(cat "$work/env/srun.log")"
RUN_DIR=runs/g run_job env_dir cpu.sbatch cfg.json || fail "cpu.sbatch cfg.json with RUN_DIR exited $?"
grep -q -- "gnmr train --config cfg.json --out runs/g --resume auto --backend cpu$" \
  "$work/env_dir/srun.log" || fail "RUN_DIR from the environment: $(cat "$work/env_dir/srun.log")"

# A run that ends with one of gnmr's own exit statuses (3: a config it refuses; 6: diverged)
# keeps it and is not requeued, though it saved a checkpoint.
for code in 3 6; do
  status=0
  FAKE_SRUN_EXIT=$code FAKE_SRUN_SAVES=runs/d/checkpoints/step_00000012 \
    run_job "failed$code" gpu-1node.sbatch cfg.json runs/d || status=$?
  [[ $status == "$code" ]] || fail "a failed run exited $status, not $code"
  [[ ! -e "$work/failed$code/scontrol.log" ]] || fail "a run that exited $code was requeued"
  grep -q "not requeueing (exit status $code is gnmr's own" "$work/failed$code/out.log" ||
    fail "a refused run: $(cat "$work/failed$code/out.log")"
done

# A failure after a checkpoint saved in this job (a lost rank: srun reports a killed task) is
# requeued to resume from it; without one since the job started, the job ends with the status.
FAKE_SRUN_EXIT=137 FAKE_SRUN_SAVES=runs/e/checkpoints/step_00000012 \
  run_job lost gpu-1node.sbatch cfg.json runs/e || fail "a requeued failure exited $?"
grep -q "requeue 4242" "$work/lost/scontrol.log" || fail "a failure after a checkpoint was not requeued"
grep -q "exit status 137 after saving step_00000012 (no checkpoint at the job's start)" \
  "$work/lost/out.log" || fail "the failure's requeue: $(cat "$work/lost/out.log")"
mkdir -p "$work/again/runs/e/checkpoints/step_00000012"  # the requeued job starts from it
status=0
FAKE_SRUN_EXIT=1 run_job again gpu-1node.sbatch cfg.json runs/e || status=$?
[[ $status == 1 ]] || fail "a failure before a new checkpoint exited $status, not 1"
[[ ! -e "$work/again/scontrol.log" ]] || fail "a failure without a new checkpoint was requeued"
grep -q "no checkpoint saved since the job started from step_00000012" "$work/again/out.log" ||
  fail "a failure without a new checkpoint: $(cat "$work/again/out.log")"
status=0
REQUEUE_ON_FAILURE=0 FAKE_SRUN_EXIT=137 FAKE_SRUN_SAVES=runs/e/checkpoints/step_00000012 \
  run_job off gpu-1node.sbatch cfg.json runs/e || status=$?
[[ $status == 137 && ! -e "$work/off/scontrol.log" ]] ||
  fail "REQUEUE_ON_FAILURE=0: exit $status, $(cat "$work/off/out.log")"
# A stop by SIGINT (scancel --signal=INT): gnmr checkpoints and ends by the signal, 130.
status=0
FAKE_SRUN_EXIT=130 FAKE_SRUN_SAVES=runs/i/checkpoints/step_00000012 \
  run_job interrupted gpu-1node.sbatch cfg.json runs/i || status=$?
[[ $status == 130 && ! -e "$work/interrupted/scontrol.log" ]] &&
  grep -q "stopped by SIGHUP or SIGINT (exit status 130), checkpointed" "$work/interrupted/out.log" ||
  fail "a stop by SIGINT: exit $status, $(cat "$work/interrupted/out.log")"
# A consolidated copy beside the checkpoints is not one the run saved.
status=0
FAKE_SRUN_EXIT=1 FAKE_SRUN_SAVES=runs/k/checkpoints/step_00000012_consolidated \
  run_job consolidated gpu-1node.sbatch cfg.json runs/k || status=$?
[[ $status == 1 && ! -e "$work/consolidated/scontrol.log" ]] ||
  fail "a consolidated copy counted as a checkpoint: exit $status"
status=0
REQUEUE_ON_FAILURE=false run_job not_a_switch gpu-1node.sbatch cfg.json runs/l || status=$?
[[ $status == 2 ]] && grep -q "REQUEUE_ON_FAILURE=false: give 0 or 1" "$work/not_a_switch/out.log" ||
  fail "REQUEUE_ON_FAILURE=false: exit $status, $(cat "$work/not_a_switch/out.log")"

# time_limit_job NAME: gpu-1node.sbatch as NAME, its batch shell sent SLURM's time-limit signal
# once srun runs (environment: FAKE_*); returns the job's exit status.
time_limit_job() {
  local name=$1 job script_pid status=0
  mkdir -p "$work/$name"
  (FAKE_SRUN_WAIT=1 run_job "$name" gpu-1node.sbatch cfg.json "runs/$name$$") &
  job=$!
  for _ in $(seq 100); do [[ -e "$work/$name/srun.started" ]] && break; sleep 0.1; done
  [[ -e "$work/$name/srun.started" ]] || fail "srun never started in $name"
  # SLURM signals the batch shell: gpu-1node.sbatch's, which exec'd into train.sbatch's body.
  script_pid=$(pgrep -f "slurm/train.sbatch cfg.json runs/$name$$")
  [[ -n "$script_pid" ]] || fail "no batch shell to signal in $name"
  kill -USR1 "$script_pid"
  wait "$job" || status=$?
  return "$status"
}

# The time-limit signal: the script forwards it, the ranks checkpoint and exit 0, the job is
# requeued under its own id.
time_limit_job limit || fail "the signalled job exited $?: $(cat "$work/limit/out.log")"
grep -q "requeue 4242" "$work/limit/scontrol.log" || fail "the signalled job was not requeued"

# A rank killed by the time-limit signal before gnmr took it (status 138): still requeued.
FAKE_SRUN_USR1_EXIT=138 time_limit_job early ||
  fail "the early-signalled job exited $?: $(cat "$work/early/out.log")"
grep -q "requeue 4242" "$work/early/scontrol.log" || fail "the early-signalled job was not requeued"

# A failure after the time-limit signal, with a checkpoint saved in the job: requeued too.
FAKE_SRUN_USR1_EXIT=1 FAKE_SRUN_SAVES="runs/late$$/checkpoints/step_00000012" time_limit_job late ||
  fail "a failure after the time-limit signal exited $?: $(cat "$work/late/out.log")"
grep -q "requeue 4242" "$work/late/scontrol.log" ||
  fail "a failure after the time-limit signal was not requeued: $(cat "$work/late/out.log")"

# A refused requeue (--no-requeue) fails the job and says the checkpoint is kept.
status=0
FAKE_SCONTROL_EXIT=1 time_limit_job refused || status=$?
[[ $status == 1 ]] || fail "a refused requeue exited $status, not 1"
grep -q "the requeue was refused" "$work/refused/out.log" ||
  fail "a refused requeue: $(cat "$work/refused/out.log")"
echo "check_slurm_scripts: all checks passed"
