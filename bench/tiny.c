/* The floors for a process start and exit: a static C program that does nothing (bench_calls).
   With an argument it says "r" on stdout and waits for a signal: the exit floor. */
#include <unistd.h>

int main(int argc, char** argv) {
  (void)argv;
  if (argc > 1) {
    if (write(1, "r", 1) != 1) return 1;
    pause();
  }
  return 0;
}
