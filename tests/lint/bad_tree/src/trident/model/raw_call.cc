// Fixture: a model file that calls the kernels' raw entry points (the check must fail on it).
#include "trident/kernels/dispatch.h"
