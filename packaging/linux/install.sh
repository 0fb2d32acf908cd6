#!/bin/sh
# Install Shoal from this unpacked folder so the desktop finds it: the app under
# PREFIX/lib/shoal, `shoal` on PREFIX/bin, the menu entry and icons under PREFIX/share.
#   ./install.sh              for this user (PREFIX=~/.local)
#   sudo ./install.sh --system   for everyone (PREFIX=/usr/local)
#   ./install.sh --prefix DIR    anywhere;  add --uninstall to remove what it put there
set -eu
here=$(cd "$(dirname "$0")" && pwd)
prefix="${HOME}/.local"
uninstall=0
while [ $# -gt 0 ]; do
  case "$1" in
    --system) prefix=/usr/local ;;
    --prefix) prefix=${2:?--prefix needs a folder}; shift ;;
    --uninstall) uninstall=1 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
app="$prefix/lib/shoal"
apps="$prefix/share/applications"
icons="$prefix/share/icons/hicolor"

refresh() {  # menus and icon caches pick up the change without a new login
  command -v update-desktop-database >/dev/null 2>&1 && update-desktop-database -q "$apps" || true
  command -v gtk-update-icon-cache >/dev/null 2>&1 && gtk-update-icon-cache -q -t "$icons" || true
}

if [ "$uninstall" -eq 1 ]; then
  rm -rf "$app" "$prefix/bin/shoal" "$apps/shoal.desktop"
  find "$icons" -name 'shoal.png' -o -name 'shoal.svg' 2>/dev/null | xargs rm -f
  refresh
  echo "Removed Shoal from $prefix (your models and settings are kept)."
  exit 0
fi

mkdir -p "$app" "$prefix/bin" "$apps" "$icons"
if [ "$here" != "$app" ]; then
  rm -rf "$app"
  cp -a "$here" "$app"
fi
ln -sf "$app/shoal" "$prefix/bin/shoal"
sed "s|^Exec=.*|Exec=$app/shoal|" "$here/shoal.desktop" > "$apps/shoal.desktop"
cp -a "$here/icons/hicolor/." "$icons/"
refresh
echo "Installed Shoal in $app; it is in your applications menu and on $prefix/bin as 'shoal'."
case ":$PATH:" in *":$prefix/bin:"*) ;; *) echo "Add $prefix/bin to PATH to run 'shoal' from a terminal." ;; esac
