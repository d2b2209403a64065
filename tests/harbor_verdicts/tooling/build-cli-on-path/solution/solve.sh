#!/bin/bash
cat > /app/bin/wordstat <<'SH'
#!/bin/bash
l=$(wc -l < "$1"); w=$(wc -w < "$1"); c=$(wc -m < "$1")
echo "$l $w $c"
SH
chmod +x /app/bin/wordstat
