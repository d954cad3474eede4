/* The floor for a process start: a static C program that does nothing (bench_calls). */
int main(void) { return 0; }
