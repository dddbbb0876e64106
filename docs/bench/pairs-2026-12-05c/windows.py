import sys
bursts=[];cur=None
for l in open(sys.argv[1]):
    if l.startswith('#'): cur={'h':l.strip(),'rows':[]}; bursts.append(cur); continue
    if l.startswith('ms'): cur['hdr']=l.rstrip('\n').split('\t'); continue
    cur['rows'].append([float(x) if x!='-' else None for x in l.split()])
for b in bursts:
    print(b['h']); H=b['hdr']
    show=['api cpu ms','load generator cpu ms','mysqld cpu ms','worker cpu ms','Questions','Com_select','Com_insert','Com_delete','Com_update','Com_call_procedure','Com_rollback','Innodb_row_lock_waits','Innodb_buffer_pool_pages_flushed','Innodb_data_fsyncs','Innodb_os_log_written']
    short=['api','gen','mysqld','worker','Q','sel','ins','del','upd','call','rb','lockw','flush','fsync','logB']
    print('  window     ans '+' '.join(f'{s:>7}' for s in short)+'   (cpu in us/answer, counts per 100 answers, log bytes/answer)')
    rows=[r for r in b['rows'] if None not in r]; prev=[0]*len(H)
    edges=[0,250,500,1000,2000,1e9]
    for lo,hi in zip(edges,edges[1:]):
        sel=[r for r in rows if lo<r[0]<=hi]
        if not sel: continue
        last=sel[-1]; d=[last[i]-prev[i] for i in range(len(H))]; a=d[1]
        if a<=0: continue
        out=[]
        for s in show:
            i=H.index(s)
            if 'cpu' in s: out.append(1000*d[i]/a)
            elif s=='Innodb_os_log_written': out.append(d[i]/a)
            else: out.append(100*d[i]/a)
        print(f'  {lo:>4}-{hi if hi<1e9 else "end":>5} {a:5.0f} '+' '.join(f'{x:7.0f}' for x in out))
        prev=last
