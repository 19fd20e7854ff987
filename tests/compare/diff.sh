#!/usr/bin/env bash
# diff.sh A.txt B.txt : compare two weights.sh tables by (name, ranks);
# prints each run with "same" / "DIFF" / "only in A|B"; exit 1 if any DIFF.
awk 'FNR==1{f++} /^#/ || NF<4 {next}
     {k=$1" "$2; v=$3" "$4; if(f==1){a[k]=v; order[++n]=k} else {b[k]=v; if(!(k in a)) order[++n]=k}}
     END{bad=0; for(i=1;i<=n;i++){k=order[i];
           s = !(k in b) ? "only in A" : !(k in a) ? "only in B" : (a[k]==b[k] ? "same" : "DIFF");
           if(s=="DIFF") bad=1; printf "%-32s %s\n", k, s;
           if(s=="DIFF") printf "    A %s\n    B %s\n", a[k], b[k]}
         exit bad}' "$1" "$2"
