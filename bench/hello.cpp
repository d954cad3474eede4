// The baseline process for spawn benchmarks: a dynamically linked C++ hello.
#include <iostream>
int main() { std::cout << "hello\n"; }
