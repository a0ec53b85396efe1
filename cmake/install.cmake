# Install rules: idemd, idemctl, libidem (shared + static), the public
# headers and idem.pc for pkg-config. Included at the end of CMakeLists.txt
# so that it stays apart from the library's source list.
include(GNUInstallDirs)

# Both libraries are libidem: libidem.so.0 and libidem.a.
set_target_properties(idem_static PROPERTIES OUTPUT_NAME idem)

install(TARGETS idemd idemctl RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS idem idem_static
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY include/idem DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")

# idem.pc: a relocatable prefix (pcfiledir), so a tree installed with
# DESTDIR or moved elsewhere still answers the right -I and -L.
file(RELATIVE_PATH IDEM_PC_TO_PREFIX
     "${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "${CMAKE_INSTALL_PREFIX}")
string(REGEX REPLACE "/$" "" IDEM_PC_TO_PREFIX "${IDEM_PC_TO_PREFIX}")
configure_file(${CMAKE_CURRENT_LIST_DIR}/idem.pc.in ${CMAKE_CURRENT_BINARY_DIR}/idem.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/idem.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# Their tests (label packaging).
if(BUILD_TESTING OR NOT DEFINED BUILD_TESTING)
  add_subdirectory(${CMAKE_SOURCE_DIR}/tests/packaging ${CMAKE_BINARY_DIR}/tests/packaging)
endif()
