// One Catch2 (v2, Debian 12's catch2 package) main shared by every test executable.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
