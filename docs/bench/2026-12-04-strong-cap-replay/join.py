import json
from pathlib import Path
exec((Path(__file__).resolve().parent / 'sim.py').read_text().split('for scap in')[0])
PF=0.0021  # drafter prefill s per prompt token (AMD runs: 1.2-1.9 s for ~600-900 tokens)
def run(q, rule, f=2.0, scap=16):
    a_=q['answer']; rows=q['rows']
    est=PF*q['prompt_tokens']
    i=1; sec=0.0; regret=0.0; joined=False
    while i<len(a_):
        r=rows[i-1]; truth=a_[i:]; room=len(a_)-i-1
        strong=r['ng_n']>=3
        ng=r['ng'][: scap if strong else 7][:max(room,0)]
        if not joined and rule!='never' and i>=8:
            if (rule=='time' and sec>=f*est) or (rule=='regret' and regret>=f*est):
                joined=True; sec+=est
        dr=[]
        if not ng and joined:
            dr=cut(r['dr'],r['conf'],7,0.7)[:max(room,0)]
        c=ng or dr
        a=match(c,truth)
        s=cost(1+len(c))+STEP_D*len(dr)
        sec+=s
        if not strong: regret+=s
        i+=a+1
    return sec, joined
res={}
for name,rule,f in [('never','never',0),('time2','time',2),('time3','time',3),('regret1','regret',1),('regret1.5','regret',1.5),('regret2','regret',2),('regret3','regret',3),('always','time',0)]:
    out=[run(q,rule,f) for q in qs]
    res[name]=out
    print(name.ljust(10),'%.2f'%sum(o[0] for o in out),'joins',sum(o[1] for o in out))
print('per q never/time2/regret2:')
for k,q in enumerate(qs):
    print(q['qid'][-6:], len(q['answer']), ' '.join('%s %.2f%s'%(n,res[n][k][0],'*' if res[n][k][1] else '') for n in ('never','time2','regret1.5','regret2','always')))
