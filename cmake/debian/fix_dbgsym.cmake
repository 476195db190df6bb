# CPACK_POST_BUILD_SCRIPTS: mends the -dbgsym package CPack's DEB generator writes (CMake 3.25), so that it
# passes lintian and dpkg's checks as Debian's own dbgsym packages do:
#  - its md5sums lists the absolute paths of CPack's staging tree instead of paths in the package;
#  - its .debug files are executable (Debian's are 0644);
#  - it has no copyright or changelog: Debian's dbgsym packages carry usr/share/doc/<pkg>-dbgsym as a link to
#    the doc directory of the package they depend on (= version), as this one does.
# Each .ddeb is unpacked, mended and packed again with dpkg-deb.
find_program(DPKG_DEB dpkg-deb REQUIRED)
foreach(pkg IN LISTS CPACK_PACKAGE_FILES)
  if(NOT pkg MATCHES "-dbgsym_.*\\.ddeb$")
    continue()
  endif()
  get_filename_component(dir "${pkg}" DIRECTORY)
  set(root "${dir}/_dbgsym_fix")
  file(REMOVE_RECURSE "${root}")
  execute_process(COMMAND ${DPKG_DEB} -R "${pkg}" "${root}" COMMAND_ERROR_IS_FATAL ANY)
  file(STRINGS "${root}/DEBIAN/control" package_line REGEX "^Package: ")
  string(REGEX REPLACE "^Package: (.*)-dbgsym$" "\\1" main "${package_line}")
  file(GLOB_RECURSE files LIST_DIRECTORIES false RELATIVE "${root}" "${root}/usr/*")
  set(md5sums "")
  foreach(f IN LISTS files)
    if(NOT IS_SYMLINK "${root}/${f}")
      file(CHMOD "${root}/${f}" PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
      file(MD5 "${root}/${f}" sum)
      string(APPEND md5sums "${sum}  ${f}\n")
    endif()
  endforeach()
  file(WRITE "${root}/DEBIAN/md5sums" "${md5sums}")
  file(MAKE_DIRECTORY "${root}/usr/share/doc")
  file(CREATE_LINK "${main}" "${root}/usr/share/doc/${main}-dbgsym" SYMBOLIC)
  execute_process(COMMAND ${DPKG_DEB} --root-owner-group -Zxz -b "${root}" "${pkg}" OUTPUT_QUIET COMMAND_ERROR_IS_FATAL ANY)
  file(REMOVE_RECURSE "${root}")
endforeach()
