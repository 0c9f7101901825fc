// Fixture: a core header that includes a module to its right (the check must fail on it).
#include "trident/train/trainer.h"
