# Marker environments for the machines the lock covers (uv.lock: linux x86-64 only).
{
  # The environment of CPython on x86-64 Linux.
  #
  # # Type
  #   cpython :: String -> AttrSet
  #
  # # Arguments
  #   fullVersion: the interpreter's version, e.g. "3.12.11"
  #
  # # Example
  #   (cpython "3.12.11").python_version  => "3.12"
  cpython =
    fullVersion:
    let
      parts = builtins.splitVersion fullVersion;
    in
    {
      python_full_version = fullVersion;
      python_version = "${builtins.elemAt parts 0}.${builtins.elemAt parts 1}";
      implementation_name = "cpython";
      platform_python_implementation = "CPython";
      sys_platform = "linux";
      platform_system = "Linux";
      platform_machine = "x86_64";
      os_name = "posix";
    };
}
