// The translation unit tests/CMakeLists.txt builds the tests' precompiled header for
// (gnmr_test_pch); it has no code of its own.
