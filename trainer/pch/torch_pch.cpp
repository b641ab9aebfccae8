// Empty: the translation unit that builds trainer/pch/torch_pch.h precompiled (see CMakeLists.txt).
