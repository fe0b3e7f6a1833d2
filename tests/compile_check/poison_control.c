/* compile_check/poison_control.c - must FAIL to compile with -Ipoison: proves the poison works. */
#include <cuda.h>
int main(void) { return 0; }
