// One include, compiled against a single module's include roots (see CMakeLists.txt here).
#include MOESH_PROBE_HEADER
