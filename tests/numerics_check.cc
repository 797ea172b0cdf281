/* numerics_check.c compiled as C++: <kvhal/kvhal_numerics.h> in a C++ program gives libkvhal's results too. */
#include "numerics_check.c"
