#!/bin/sh
# A sweep trial that keeps its progress as a command does (docs/sweeps.md#checkpoints): STEPS
# steps, a checkpoint every EVERY, written into a folder of its own ($ISORUN_CHECKPOINT_DIR/tmp-STEP)
# and committed by printing {"checkpoint": STEP}; it resumes from $ISORUN_RESUME_FROM. For each
# step it does it appends "TRIAL STEP" to LOG: the trial's own count of its work, redone steps
# included. It holds a shared lock on LOG.lock while it (or anything it started) lives, so that a
# test can wait for every trial to be gone.
#
# MODE (or $TRIAL_MODE): "crash:N" kills itself at step N the first time a trial reaches it;
# "term:N" sends itself SIGTERM at step N, every time;
# "warned" waits after its first checkpoint, and when warned (SIGUSR1) saves checkpoint STEP+1
# (the step it reached) and exits 3; "warned-once" does so the first time a trial runs. A trial
# that waits has written its pid to LOG.pid.TRIAL_ID first.
# Usage: checkpointed_trial.sh LOG STEPS EVERY TRIAL_NUMBER [MODE]
log=$1 steps=$2 every=$3 mode=${5:-${TRIAL_MODE:-}}
exec 9>>"$log.lock"
flock -s 9
step=0
if [ -n "$ISORUN_RESUME_FROM" ]; then step=$(cat "$ISORUN_RESUME_FROM/state"); fi
finished=$step
save() {
  mkdir "$ISORUN_CHECKPOINT_DIR/tmp-$1" && echo "$step" > "$ISORUN_CHECKPOINT_DIR/tmp-$1/state"
  echo "{\"checkpoint\": $1}"
}
if [ "$mode" = warned-once ]; then
  if [ -e "$log.warned.$ISORUN_TRIAL" ]; then mode=; else mode=warned; : > "$log.warned.$ISORUN_TRIAL"; fi
fi
if [ "$mode" = warned ]; then
  # (The step it has finished: a warning during a step's work saves the one before.)
  trap 'echo "$ISORUN_TRIAL warned" >> "$log"; step=$finished; save $((finished + 1)); exit 3' USR1
fi
while [ "$step" -lt "$steps" ]; do
  step=$((step + 1))
  sleep "${STEP_S:-0.01}"  # the step's work
  echo "$ISORUN_TRIAL $step" >> "$log"
  echo "{\"step\": $step, \"loss\": $((steps - step))}"
  finished=$step
  if [ "$mode" = "crash:$step" ] && [ ! -e "$log.crashed.$ISORUN_TRIAL" ]; then
    : > "$log.crashed.$ISORUN_TRIAL"
    kill -9 $$
  fi
  if [ "$mode" = "term:$step" ]; then kill -TERM $$; fi
  if [ $((step % every)) -eq 0 ]; then
    save "$step"
    if [ "$mode" = warned ]; then
      echo $$ > "$log.pid.$ISORUN_TRIAL"
      echo waiting >> "$log"
      while :; do sleep 1 & wait $!; done  # (wait returns at the signal: the trap runs at once)
    fi
  fi
done
echo "{\"steps\": $step, \"loss\": 0}"
