# Build-time script: writes OUT, a C++ file holding every OpenCL source in SOURCES
# (a ;-list of .cl paths) as a string, so the binary reads no kernel file at run time.
#   cmake -DOUT=kernels.cpp -DSOURCES="a.cl;b.cl" -P embed_kernels.cmake
set(body "")
set(table "")
foreach(path IN LISTS SOURCES)
  get_filename_component(name ${path} NAME_WE)
  file(READ ${path} text)
  string(APPEND body "constexpr char k_${name}[] = R\"tandem_cl(${text})tandem_cl\";\n")
  string(APPEND table "    {\"${name}\", k_${name}},\n")
endforeach()
file(WRITE ${OUT}.tmp
  "// Generated from backends/opencl/kernels/*.cl by embed_kernels.cmake; do not edit.\n"
  "#include \"backends/opencl/program.h\"\n\n"
  "namespace tandem::opencl {\nnamespace {\n${body}\n"
  "constexpr KernelSource kSources[] = {\n${table}};\n}  // namespace\n\n"
  "std::span<const KernelSource> embeddedSources() { return kSources; }\n\n"
  "}  // namespace tandem::opencl\n")
# Touch OUT only when it changed, so an unrelated rebuild does not recompile it.
execute_process(COMMAND ${CMAKE_COMMAND} -E copy_if_different ${OUT}.tmp ${OUT})
file(REMOVE ${OUT}.tmp)
